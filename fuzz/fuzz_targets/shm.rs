//! The shared-memory handshake and mapping header decoders: any bytes either fail with an
//! error or parse to a request, hello, ack or header that emits back to exactly the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use urom_wire::shm::{MappingHeaderRepr, ShmAckRepr, ShmHelloRepr, ShmRequestRepr};

fn check(bytes: &[u8], emit: impl Fn(&mut [u8]) -> usize) {
    let mut out = vec![0xa5; bytes.len() + 1];
    let written = emit(&mut out);
    assert_eq!(&out[..written], bytes);
    assert_eq!(out[written], 0xa5, "wrote past its end");
}

fuzz_target!(|data: &[u8]| {
    if let Ok(hello) = ShmHelloRepr::parse(data) {
        check(data, |buf| {
            hello.emit(buf).expect("a parsed hello emits again")
        });
    }
    if let Ok(request) = ShmRequestRepr::parse(data) {
        check(data, |buf| {
            request.emit(buf).expect("a parsed request emits again")
        });
    }
    if let Ok(ack) = ShmAckRepr::parse(data) {
        check(data, |buf| ack.emit(buf).expect("a parsed ack emits again"));
    }
    if let Ok(header) = MappingHeaderRepr::parse(data) {
        check(data, |buf| {
            header.emit(buf).expect("a parsed header emits again")
        });
    }
});
