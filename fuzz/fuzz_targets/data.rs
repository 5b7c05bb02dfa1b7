//! The data-path decoder: any bytes either fail with an error or parse to a command or
//! notification that the hot-path writers reproduce byte for byte, and that the hot paths' fast
//! parses read alike.
#![no_main]

use libfuzzer_sys::fuzz_target;
use urom_wire::data::{
    COMMAND_PAYLOAD_OFFSET, DataMessage, NOTIFY_PAYLOAD_OFFSET, fast_command, fast_notification,
    write_command_headers, write_notify_headers,
};
use urom_wire::frame::frame_length;
use urom_wire::{FrameRepr, MaxMsgSize};

fuzz_target!(|data: &[u8]| {
    let max = MaxMsgSize::DEFAULT;
    let claimed = frame_length(data, max);
    let parsed = FrameRepr::<DataMessage>::parse(data, max);
    // The hot paths' fast parses read exactly what the full parse reads as their kind.
    let body = parsed.as_ref().ok().map(|frame| frame.body);
    assert_eq!(
        fast_command(data, max).map(DataMessage::Command),
        body.filter(|body| matches!(body, DataMessage::Command(_)))
    );
    assert_eq!(
        fast_notification(data, max).map(DataMessage::Notify),
        body.filter(|body| matches!(body, DataMessage::Notify(_)))
    );
    let Ok(frame) = parsed else {
        return;
    };
    assert_eq!(claimed, Ok(Some(data.len())));
    let mut out = vec![0xa5; data.len()];
    let written = frame
        .emit(&mut out, max)
        .expect("a parsed frame emits again");
    assert_eq!(&out[..written], data);

    let mut in_place = vec![0xa5; data.len()];
    let (len, offset, payload) = match frame.body {
        DataMessage::Command(c) => (
            write_command_headers(
                &mut in_place,
                frame.seq,
                c.plugin,
                c.urom_context,
                c.payload.len(),
                max,
            ),
            COMMAND_PAYLOAD_OFFSET,
            c.payload,
        ),
        DataMessage::Notify(n) => (
            write_notify_headers(
                &mut in_place,
                frame.seq,
                n.plugin,
                n.urom_context,
                n.status,
                n.payload.len(),
                max,
            ),
            NOTIFY_PAYLOAD_OFFSET,
            n.payload,
        ),
    };
    let len = len.expect("a parsed frame's headers are written again");
    in_place[offset..len].copy_from_slice(payload);
    assert_eq!(&in_place[..len], data);
});
