//! Cost of encoding and decoding the hot-path frames, beside a plain copy of the same bytes.
//!
//! `cargo bench -p urom-benches --bench wire`

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use urom_wire::data::{COMMAND_PAYLOAD_OFFSET, DataMessage, write_command_headers};
use urom_wire::gpu::{CLIENT_HEADER_LEN, GpuMessage, write_client_headers};
use urom_wire::{Body, FrameRepr, MaxMsgSize};

const PAYLOAD: usize = 64;

fn command_frame(c: &mut Criterion) {
    let max = MaxMsgSize::DEFAULT;
    let mut frame = [0u8; COMMAND_PAYLOAD_OFFSET + PAYLOAD];
    let mut copy_dst = [0u8; COMMAND_PAYLOAD_OFFSET + PAYLOAD];
    let mut group = c.benchmark_group("command_frame_64B");
    group.bench_function("baseline_copy", |b| {
        b.iter(|| {
            copy_dst.copy_from_slice(black_box(&frame));
            black_box(&copy_dst);
        })
    });
    group.bench_function("write_headers", |b| {
        let mut seq = 0u64;
        b.iter(|| {
            seq += 1;
            let len = write_command_headers(&mut frame, seq, 1, seq, PAYLOAD, max).unwrap();
            black_box(&frame[..len]);
        })
    });
    write_command_headers(&mut frame, 1, 1, 7, PAYLOAD, max).unwrap();
    group.bench_function("parse", |b| {
        b.iter(|| {
            let parsed = FrameRepr::<DataMessage>::parse(black_box(&frame), max).unwrap();
            black_box(parsed.body.kind());
        })
    });
    group.finish();
}

fn gpu_request(c: &mut Criterion) {
    let mut message = [0u8; CLIENT_HEADER_LEN + PAYLOAD];
    write_client_headers(&mut message, false, PAYLOAD, 256).unwrap();
    let mut group = c.benchmark_group("gpu_client_request_64B");
    group.bench_function("parse", |b| {
        b.iter(|| black_box(GpuMessage::parse(black_box(&message), 256).unwrap()))
    });
    group.finish();
}

criterion_group!(benches, command_frame, gpu_request);
criterion_main!(benches);
