//! The GPU offload decoder, whole messages and as a TCP stream: any bytes either fail with an
//! error or parse to messages that emit back to the same bytes; the data path's fast read of
//! client messages (`fast_client_message`) takes exactly what the full parse takes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use urom_wire::gpu::{
    DEFAULT_MAX_MESSAGE_LENGTH, GpuMessage, MsgId, fast_client_message, message_length,
};

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

/// The fast read of the client message at the start of `bytes` agrees with the full parse.
fn check_fast_read(bytes: &[u8]) {
    let full = match message_length(bytes, DEFAULT_MAX_MESSAGE_LENGTH) {
        Ok(Some(length)) if length <= bytes.len() => {
            GpuMessage::parse(&bytes[..length], DEFAULT_MAX_MESSAGE_LENGTH)
                .ok()
                .map(|message| (message.msg_id(), length))
        }
        _ => None,
    };
    for id in [MsgId::ClientRequest, MsgId::ClientResponse] {
        let expected = full
            .filter(|(kind, _)| *kind == id)
            .map(|(_, length)| length);
        assert_eq!(
            fast_client_message(bytes, id, DEFAULT_MAX_MESSAGE_LENGTH),
            expected
        );
    }
}

fuzz_target!(|data: &[u8]| {
    check_message(data);
    check_fast_read(data);
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
