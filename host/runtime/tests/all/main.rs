//! Integration tests: real provider components (built by `just build-components`) on the real
//! runtime.

mod budgets;
mod cache;
mod calls;
mod capabilities;
mod common;
mod hot_swap;
mod limits;
mod load;
mod logs;
mod memory_creator;
mod outgoing;
mod tiering;
mod versions;
