//! The GPU offload channel hello and data listener decoders: any bytes either fail with an
//! error or parse to a record that emits back to exactly the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use urom_wire::gpu::channel::{ChannelHelloRepr, DataHelloRepr, DataListenerRepr};

fn check(bytes: &[u8], emit: impl Fn(&mut [u8]) -> usize) {
    let mut out = vec![0xa5; bytes.len() + 1];
    let written = emit(&mut out);
    assert_eq!(&out[..written], bytes);
    assert_eq!(out[written], 0xa5, "wrote past its end");
}

fuzz_target!(|data: &[u8]| {
    if let Ok(hello) = ChannelHelloRepr::parse(data) {
        check(data, |buf| {
            hello.emit(buf).expect("a parsed hello emits again")
        });
    }
    if let Ok(hello) = DataHelloRepr::parse(data) {
        check(data, |buf| {
            hello.emit(buf).expect("a parsed hello emits again")
        });
    }
    if let Ok(listener) = DataListenerRepr::parse(data) {
        check(data, |buf| {
            listener.emit(buf).expect("a parsed record emits again")
        });
    }
});
