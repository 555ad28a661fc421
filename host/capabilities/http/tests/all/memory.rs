//! Reading every byte a guest ever held: linear memories that keep a snapshot when dropped.

use std::sync::{Arc, Mutex};

use memchr::memmem;
use wasmtime::{LinearMemory, MemoryCreator, MemoryType};

/// Linear memories that keep a copy of their final contents when the instance drops them, so a
/// test can read every byte a guest ever had in memory (freed heap included).
#[derive(Clone, Default)]
pub struct SnapshotCreator {
    pub snapshots: Arc<Mutex<Vec<Vec<u8>>>>,
}

struct SnapshotMemory {
    base: *mut u8,
    /// Reserved and guard bytes, all mapped once; only `0..size` is readable and writable.
    mapped: usize,
    reserved: usize,
    size: usize,
    snapshots: Arc<Mutex<Vec<Vec<u8>>>>,
}

// SAFETY: the mapping is owned by this value alone; wasmtime serialises access to it.
unsafe impl Send for SnapshotMemory {}
// SAFETY: as above; `&self` methods only read plain fields.
unsafe impl Sync for SnapshotMemory {}

fn page_round(bytes: usize) -> usize {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
    bytes.div_ceil(page) * page
}

// SAFETY: the memory is reserved whole up front (never moves), zero-filled by mmap, and the guard
// region after the reservation stays PROT_NONE as wasmtime requires.
unsafe impl LinearMemory for SnapshotMemory {
    fn byte_size(&self) -> usize {
        self.size
    }

    fn byte_capacity(&self) -> usize {
        self.reserved
    }

    fn grow_to(&mut self, new_size: usize) -> wasmtime::Result<()> {
        if new_size > self.reserved {
            return Err(wasmtime::format_err!(
                "cannot grow to {new_size} bytes past the reservation"
            ));
        }
        // SAFETY: the range lies inside our own mapping.
        let result = unsafe {
            libc::mprotect(
                self.base.cast(),
                page_round(new_size),
                libc::PROT_READ | libc::PROT_WRITE,
            )
        };
        if result != 0 {
            return Err(wasmtime::format_err!(
                "mprotect: {}",
                std::io::Error::last_os_error()
            ));
        }
        self.size = new_size;
        Ok(())
    }

    fn as_ptr(&self) -> *mut u8 {
        self.base
    }
}

impl Drop for SnapshotMemory {
    fn drop(&mut self) {
        // SAFETY: `0..size` is mapped readable, and the instance using it is gone.
        let contents = unsafe { std::slice::from_raw_parts(self.base, self.size) }.to_vec();
        self.snapshots.lock().unwrap().push(contents);
        // SAFETY: unmapping exactly what `new_memory` mapped.
        unsafe { libc::munmap(self.base.cast(), self.mapped) };
    }
}

// SAFETY: see `LinearMemory for SnapshotMemory`.
unsafe impl MemoryCreator for SnapshotCreator {
    fn new_memory(
        &self,
        _ty: MemoryType,
        minimum: usize,
        maximum: Option<usize>,
        reserved_size_in_bytes: Option<usize>,
        guard_size_in_bytes: usize,
    ) -> Result<Box<dyn LinearMemory>, String> {
        let reserved = page_round(
            reserved_size_in_bytes
                .unwrap_or(maximum.unwrap_or(1 << 32))
                .max(minimum),
        );
        let mapped = reserved + guard_size_in_bytes;
        // SAFETY: a fresh anonymous mapping, inaccessible until `grow_to` opens it.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                mapped,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(format!("mmap: {}", std::io::Error::last_os_error()));
        }
        let mut memory = SnapshotMemory {
            base: base.cast(),
            mapped,
            reserved,
            size: 0,
            snapshots: self.snapshots.clone(),
        };
        if minimum > 0 {
            memory.grow_to(minimum).map_err(|error| error.to_string())?;
        }
        Ok(Box::new(memory))
    }
}

/// Whether `needle` occurs in `haystack`.
pub fn contains(haystack: &[u8], needle: &str) -> bool {
    memmem::find(haystack, needle.as_bytes()).is_some()
}
