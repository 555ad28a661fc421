//! What redaction costs on a credentialed response body: the streaming redactor on a clean
//! Proxmox-sized answer (the common case: nothing to remove) and on one that echoes the secret,
//! beside the floor of copying the same chunks.
//!
//! Run: `cargo bench -p egress-capability-http --bench redact`.

use base64::Engine;
use bytes::{Bytes, BytesMut};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use egress_capability_http::Redactor;
use std::hint::black_box;

const SECRET: &str = "root@pam!op=0f1e2d3c-aaaa-bbbb-cccc-1234567890ab";

/// A JSON answer shaped like Proxmox's VM config, about `size` bytes.
fn clean_body(size: usize) -> Bytes {
    let mut text = String::from("{\"data\":{");
    let mut key = 0;
    while text.len() < size {
        text.push_str(&format!(
            "\"net{key}\":\"virtio=BC:24:11:{:02X}:{:02X}:01,bridge=vmbr0,firewall=1\",",
            key % 256,
            (key * 7) % 256
        ));
        key += 1;
    }
    text.push_str("\"digest\":\"5f0c7e8d9a\"}}");
    Bytes::from(text)
}

/// The same body with the header value echoed as is, base64-encoded, and percent-encoded.
fn echoing_body(size: usize) -> Bytes {
    let value = format!("PVEAPIToken={SECRET}");
    let echoes = format!(
        "{{\"echo\":\"{value}\",\"b64\":\"{}\",\"url\":\"{}\",",
        base64::engine::general_purpose::STANDARD.encode(format!("Authorization: {value}")),
        value
            .replace('@', "%40")
            .replace('!', "%21")
            .replace('=', "%3D")
    );
    let clean = clean_body(size);
    let mut body = BytesMut::from(echoes.as_bytes());
    body.extend_from_slice(&clean[1..]);
    body.freeze()
}

fn redaction(c: &mut Criterion) {
    let redactor = Redactor::new(SECRET, &format!("PVEAPIToken={SECRET}"));
    let mut group = c.benchmark_group("redaction of a response body");
    // A Proxmox answer arrives in one chunk; a large one in hyper's 16 KiB reads.
    for (size, chunk) in [(4 << 10, 4 << 10), (256 << 10, 16 << 10)] {
        for (kind, body) in [("clean", clean_body(size)), ("echoing", echoing_body(size))] {
            let chunks: Vec<Bytes> = body.chunks(chunk).map(Bytes::copy_from_slice).collect();
            group.throughput(Throughput::Bytes(body.len() as u64));
            let id = format!("{kind} {} KiB", size >> 10);
            group.bench_function(BenchmarkId::new("copy (the floor)", &id), |b| {
                b.iter(|| {
                    let mut out = 0;
                    for chunk in &chunks {
                        out += BytesMut::from(&chunk[..]).freeze().len();
                    }
                    black_box(out)
                })
            });
            group.bench_function(BenchmarkId::new("streaming redaction", &id), |b| {
                b.iter(|| {
                    let mut stream = redactor.clone().stream();
                    let mut out = 0;
                    for chunk in &chunks {
                        out += stream.push(chunk).len();
                    }
                    black_box(out + stream.finish().len())
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, redaction);
criterion_main!(benches);
