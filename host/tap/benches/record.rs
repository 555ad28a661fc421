//! What the flight recorder adds to one exchange: a request and a Proxmox-sized answer (4 KiB
//! and 64 KiB) sent through a [`Recorder`] and read whole, beside the same exchange sent to the
//! same in-memory egress with no tap (the floor: no socket, so the ratio is the recorder's worst
//! case; over a real connection its share is smaller).
//!
//! Run: `cargo bench -p egress-tap --bench record`.

use std::sync::Arc;

use bytes::Bytes;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use egress_runtime::egress::{CallSite, Egress, EgressBody, EgressFuture, RequestOptions};
use egress_runtime::{Outgoing, Tap};
use egress_tap::{Bounds, Recorder};
use http_body_util::{BodyExt, Full};

/// Reads each request whole and answers it with the same body.
struct Answering(Bytes);

impl Egress for Answering {
    fn send(
        &self,
        _site: &CallSite,
        request: http::Request<EgressBody>,
        _options: Option<RequestOptions>,
    ) -> EgressFuture {
        let body = Full::new(self.0.clone())
            .map_err(|never| match never {})
            .boxed_unsync();
        Box::pin(async move {
            request.into_body().collect().await?;
            Ok(http::Response::new(body))
        })
    }
}

fn request() -> http::Request<EgressBody> {
    let body = Full::new(Bytes::from_static(b"newid=123&name=egress-a&full=1"))
        .map_err(|never| match never {})
        .boxed_unsync();
    http::Request::post("https://pve.test:8006/api2/json/nodes/pv1-1/qemu/9001/clone")
        .body(body)
        .unwrap()
}

async fn exchange(egress: &Arc<dyn Egress>, recorder: Option<&Recorder>) -> usize {
    let site = CallSite {
        provider: Arc::from("proxmox"),
        digest: Arc::from(""),
        operation: "create",
    };
    let answer = match recorder {
        Some(recorder) => {
            let outgoing = Outgoing {
                site: &site,
                request: request(),
                options: None,
            };
            recorder.send(outgoing, egress)
        }
        None => egress.send(&site, request(), None),
    };
    let body = answer.await.unwrap().into_body().collect().await.unwrap();
    body.to_bytes().len()
}

fn bench(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let mut group = c.benchmark_group("exchange");
    for size in [4 << 10, 64 << 10] {
        let egress: Arc<dyn Egress> = Arc::new(Answering(Bytes::from(vec![b'x'; size])));
        group.throughput(Throughput::Bytes(size as u64));
        group.bench_with_input(BenchmarkId::new("direct", size), &size, |b, _| {
            b.iter(|| runtime.block_on(exchange(&egress, None)));
        });
        group.bench_with_input(BenchmarkId::new("recorded", size), &size, |b, _| {
            // A recorder per call, as the CLI and the operator make one.
            b.iter(|| {
                let recorder = Recorder::new(Bounds::default());
                runtime.block_on(exchange(&egress, Some(&recorder)))
            });
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
