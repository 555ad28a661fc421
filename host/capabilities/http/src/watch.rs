//! Knowing, without blocking, whether a file may have changed since it was last read: what lets
//! the broker keep a secret or CA in memory and still use a rotated one from the next request.
//!
//! A [`FileWatch`] holds an inotify instance (Linux) watching the file (through symlinks) and
//! its parent folder: an edit in place, a file renamed over it, and Kubernetes' swap of a mounted
//! Secret's `..data` link all queue an event. The kernel queues the event before the writer's
//! call returns, so a request that starts after a rotation completed sees it: asking is one
//! non-blocking `read(2)` of the inotify descriptor, which touches no file.
//!
//! The watch is armed on a blocking thread, *before* the file is read, so a change made while it
//! is read is not lost. Where no watch can be had (another OS, the inotify instance limit, a
//! folder that does not exist yet) the answer is [`Freshness::Unwatched`], and the caller decides:
//! a secret is then read on every request, a CA kept once loaded.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use egress_runtime::lock;

/// What a [`FileWatch`] knows about its file since it was last armed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Freshness {
    /// Nothing happened to it.
    Unchanged,
    /// It (or its folder) changed: read it again.
    Changed,
    /// No watch is armed (not yet, or it could not be): nothing is known.
    Unwatched,
}

/// Watches one file for changes. See the module docs.
#[derive(Debug)]
pub struct FileWatch {
    path: PathBuf,
    /// `None` until armed, and again once a change was seen (re-armed with the next read, so a
    /// symlink that now points elsewhere is followed to its new target).
    armed: Mutex<Option<Armed>>,
}

#[cfg(target_os = "linux")]
type Armed = inotify::Inotify;
#[cfg(not(target_os = "linux"))]
type Armed = ();

impl FileWatch {
    /// A watch for `path`, not armed yet.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            armed: Mutex::new(None),
        }
    }

    /// Whether the file changed since the last [`FileWatch::arm_blocking`]. Never blocks; a
    /// change seen disarms the watch until the next arming.
    pub fn check(&self) -> Freshness {
        let mut armed = lock(&self.armed);
        let Some(watch) = armed.as_mut() else {
            return Freshness::Unwatched;
        };
        if queued_event(watch) {
            *armed = None;
            return Freshness::Changed;
        }
        Freshness::Unchanged
    }

    /// Arms the watch before the caller reads the file. Blocks (inotify_add_watch resolves the
    /// path): call it on a blocking thread. A failure leaves it unarmed, so the file is read
    /// again next time.
    pub fn arm_blocking(&self) {
        let watch = arm(&self.path);
        *lock(&self.armed) = watch;
    }
}

#[cfg(target_os = "linux")]
fn arm(path: &Path) -> Option<Armed> {
    use inotify::{Inotify, WatchMask};
    // `init` opens the descriptor non-blocking, which `queued_event` relies on.
    let inotify = Inotify::init().ok()?;
    let folder = match path.parent() {
        Some(folder) if !folder.as_os_str().is_empty() => folder,
        _ => Path::new("."),
    };
    // The folder: a file created, renamed over or removed (Kubernetes renames `..data`).
    let in_folder = WatchMask::CREATE
        | WatchMask::MOVED_TO
        | WatchMask::MOVED_FROM
        | WatchMask::DELETE
        | WatchMask::MODIFY
        | WatchMask::CLOSE_WRITE
        | WatchMask::ATTRIB
        | WatchMask::DELETE_SELF
        | WatchMask::MOVE_SELF;
    inotify.watches().add(folder, in_folder).ok()?;
    // The file itself, through symlinks: an edit where the link points. It may not exist yet
    // (a CA that has not landed): the folder's watch sees it arrive.
    let on_file = WatchMask::MODIFY
        | WatchMask::CLOSE_WRITE
        | WatchMask::ATTRIB
        | WatchMask::DELETE_SELF
        | WatchMask::MOVE_SELF;
    let _ = inotify.watches().add(path, on_file);
    Some(inotify)
}

#[cfg(not(target_os = "linux"))]
fn arm(_path: &Path) -> Option<Armed> {
    None
}

/// Whether any event is queued (or the queue cannot be read, which counts as a change).
#[cfg(target_os = "linux")]
fn queued_event(inotify: &mut Armed) -> bool {
    let mut buffer = [0u8; 1024];
    match inotify.read_events(&mut buffer) {
        Ok(mut events) => events.next().is_some(),
        Err(error) => error.kind() != std::io::ErrorKind::WouldBlock,
    }
}

#[cfg(not(target_os = "linux"))]
fn queued_event(_inotify: &mut Armed) -> bool {
    true
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn an_edit_a_rename_over_and_a_new_file_are_each_a_change() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        let watch = FileWatch::new(&path);
        assert_eq!(watch.check(), Freshness::Unwatched, "not armed yet");
        watch.arm_blocking();
        assert_eq!(
            watch.check(),
            Freshness::Unchanged,
            "the file has not landed and nothing happened"
        );

        std::fs::write(&path, "first").unwrap();
        assert_eq!(watch.check(), Freshness::Changed, "it landed");
        assert_eq!(watch.check(), Freshness::Unwatched, "a change disarms");
        watch.arm_blocking();
        assert_eq!(watch.check(), Freshness::Unchanged);

        std::fs::write(&path, "second").unwrap();
        assert_eq!(watch.check(), Freshness::Changed, "an edit in place");

        let next = dir.path().join("token.next");
        std::fs::write(&next, "third").unwrap();
        watch.arm_blocking();
        std::fs::rename(&next, &path).unwrap();
        assert_eq!(watch.check(), Freshness::Changed, "a file renamed over it");
    }

    #[test]
    fn a_change_behind_a_symlink_is_a_change() {
        let dir = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        let target = elsewhere.path().join("token");
        std::fs::write(&target, "first").unwrap();
        let link = dir.path().join("token");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let watch = FileWatch::new(&link);
        watch.arm_blocking();
        assert_eq!(watch.check(), Freshness::Unchanged);
        std::fs::write(&target, "second").unwrap();
        assert_eq!(watch.check(), Freshness::Changed, "the target was edited");
    }
}
