//! The UCX transport's decoders (handshake hello and answer, data and control headers, a
//! batch's entries): any bytes either fail with an error or parse to a message that emits back
//! to exactly the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use urom_wire::ucx::{
    UcxAnswerRepr, UcxBatchFrames, UcxControlRepr, UcxDataRepr, UcxHelloRepr, emit_batch_entry,
};

fn check(bytes: &[u8], emit: impl Fn(&mut [u8]) -> usize) {
    let mut out = vec![0xa5; bytes.len() + 1];
    let written = emit(&mut out);
    assert_eq!(&out[..written], bytes);
    assert_eq!(out[written], 0xa5, "wrote past its end");
}

fuzz_target!(|data: &[u8]| {
    if let Ok(hello) = UcxHelloRepr::parse(data) {
        check(data, |buf| {
            hello.emit(buf).expect("a parsed hello emits again")
        });
    }
    if let Ok(answer) = UcxAnswerRepr::parse(data) {
        check(data, |buf| {
            answer.emit(buf).expect("a parsed answer emits again")
        });
    }
    if let Ok(header) = UcxDataRepr::parse(data) {
        check(data, |buf| {
            header.emit(buf).expect("a parsed data header emits again")
        });
    }
    if let Ok(control) = UcxControlRepr::parse(data) {
        check(data, |buf| {
            control
                .emit(buf)
                .expect("a parsed control header emits again")
        });
    }
    let frames: Result<Vec<&[u8]>, _> = UcxBatchFrames::new(data).collect();
    if let Ok(frames) = frames {
        check(data, |buf| {
            frames.iter().fold(0, |at, frame| {
                at + emit_batch_entry(&mut buf[at..], frame).expect("a parsed entry emits again")
            })
        });
    }
});
