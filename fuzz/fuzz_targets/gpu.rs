//! The GPU offload decoder, whole messages and as a TCP stream: any bytes either fail with an
//! error or parse to messages that emit back to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use urom_wire::gpu::{DEFAULT_MAX_MESSAGE_LENGTH, GpuMessage, message_length};

fn check_message(bytes: &[u8]) {
    let Ok(message) = GpuMessage::parse(bytes, DEFAULT_MAX_MESSAGE_LENGTH) else {
        return;
    };
    let mut out = vec![0xa5; bytes.len()];
    let written = message
        .emit(&mut out, DEFAULT_MAX_MESSAGE_LENGTH)
        .expect("a parsed message emits again");
    assert_eq!(&out[..written], bytes);
}

fuzz_target!(|data: &[u8]| {
    check_message(data);
    // Read the input as a stream the way a server does: header first, then the whole message.
    let mut rest = data;
    while let Ok(Some(length)) = message_length(rest, DEFAULT_MAX_MESSAGE_LENGTH) {
        let Some(message) = rest.get(..length) else {
            break;
        };
        check_message(message);
        rest = &rest[length..];
    }
});
