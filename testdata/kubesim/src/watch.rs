//! Watch streams: newline-delimited JSON events, replayed from history after the requested
//! resourceVersion, then live until the timeout, [`KubeSim::close_watches`] or the client
//! leaves.
//!
//! [`KubeSim::close_watches`]: crate::KubeSim::close_watches

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::time::{Instant, interval_at, sleep_until};

use crate::Shared;
use crate::api::{WatchRequest, WatchStart, partial};
use crate::store::ChangeKind;

/// A response body fed by the watch task.
pub(crate) struct ChannelBody(mpsc::Receiver<Bytes>);

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0
            .poll_recv(cx)
            .map(|chunk| chunk.map(|b| Ok(Frame::data(b))))
    }
}

/// Starts the watch task; its events arrive through the returned body.
pub(crate) fn stream(shared: Arc<Shared>, request: WatchRequest) -> ChannelBody {
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        shared.open_watches.fetch_add(1, Ordering::SeqCst);
        run(&shared, &request, &tx).await;
        shared.open_watches.fetch_sub(1, Ordering::SeqCst);
    });
    ChannelBody(rx)
}

fn line(kind: &str, object: &Value) -> Bytes {
    let mut text = json!({ "type": kind, "object": object }).to_string();
    text.push('\n');
    Bytes::from(text)
}

fn bookmark(request: &WatchRequest, rv: u64, initial_end: bool) -> Bytes {
    let rt = &request.selection.rt;
    let (api_version, kind) = if request.metadata_only {
        ("meta.k8s.io/v1".to_string(), "PartialObjectMetadata")
    } else {
        (rt.api_version(&request.selection.version), rt.kind.as_str())
    };
    let mut metadata = json!({ "resourceVersion": rv.to_string() });
    if initial_end {
        metadata["annotations"] = json!({ "k8s.io/initial-events-end": "true" });
    }
    line(
        "BOOKMARK",
        &json!({ "apiVersion": api_version, "kind": kind, "metadata": metadata }),
    )
}

fn event(request: &WatchRequest, kind: ChangeKind, object: &Value) -> Bytes {
    let name = match kind {
        ChangeKind::Added => "ADDED",
        ChangeKind::Modified => "MODIFIED",
        ChangeKind::Deleted => "DELETED",
    };
    if request.metadata_only {
        line(name, &partial(object))
    } else {
        line(name, object)
    }
}

async fn run(shared: &Shared, request: &WatchRequest, tx: &mpsc::Sender<Bytes>) {
    let mut changed = shared.changed.subscribe();
    let mut closing = shared.close_watches.subscribe();
    changed.borrow_and_update();
    closing.borrow_and_update();
    let deadline = request.timeout.map(|t| Instant::now() + t);
    let (initial, mut position) = match request.start {
        WatchStart::Now { initial } => {
            let store = shared.store();
            let objects = if initial {
                store.select(&request.selection)
            } else {
                Vec::new()
            };
            (objects, store.resource_version())
        }
        WatchStart::After(rv) => (Vec::new(), rv),
    };
    for object in &initial {
        if tx
            .send(event(request, ChangeKind::Added, object))
            .await
            .is_err()
        {
            return;
        }
    }
    if request.initial_events_end && tx.send(bookmark(request, position, true)).await.is_err() {
        return;
    }
    let every = shared.bookmark_interval;
    let mut bookmarks = interval_at(Instant::now() + every, every);
    loop {
        changed.borrow_and_update();
        let found = shared.store().changes_since(&request.selection, position);
        match found {
            Ok((events, reached)) => {
                for (kind, object) in &events {
                    if tx.send(event(request, *kind, object)).await.is_err() {
                        return;
                    }
                }
                position = reached;
            }
            Err(gone) => {
                // The real server answers 200 and sends the 410 as an ERROR event.
                let _ = tx.send(line("ERROR", &gone.to_status())).await;
                return;
            }
        }
        tokio::select! {
            done = changed.changed() => if done.is_err() { return },
            _ = closing.changed() => return,
            () = async {
                match deadline {
                    Some(d) => sleep_until(d).await,
                    None => std::future::pending().await,
                }
            } => return,
            _ = bookmarks.tick(), if request.bookmarks => {
                if tx.send(bookmark(request, position, false)).await.is_err() {
                    return;
                }
            }
            () = tx.closed() => return,
        }
    }
}
