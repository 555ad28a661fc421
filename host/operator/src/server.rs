//! Health and metrics: in progress.
