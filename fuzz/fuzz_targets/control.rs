//! The control-socket decoder, and the daemon-link decoder beside it: any bytes either fail
//! with an error or parse to a message that emits back to exactly the same bytes (the encoding
//! is canonical).
#![no_main]

use libfuzzer_sys::fuzz_target;
use urom_wire::control::ControlMessage;
use urom_wire::frame::frame_length;
use urom_wire::link::{LINK_MAX_MSG_SIZE, LinkMessage};
use urom_wire::{FrameRepr, MaxMsgSize};

fuzz_target!(|data: &[u8]| {
    if let Ok(frame) = FrameRepr::<LinkMessage>::parse(data, LINK_MAX_MSG_SIZE) {
        if let LinkMessage::CountersReply(report) = frame.body {
            assert_eq!(report.errors.iter().count(), report.errors.len());
        }
        let mut out = vec![0xa5; data.len()];
        let written = frame
            .emit(&mut out, LINK_MAX_MSG_SIZE)
            .expect("a parsed frame emits again");
        assert_eq!(&out[..written], data);
    }
    let max = MaxMsgSize::DEFAULT;
    let claimed = frame_length(data, max);
    let Ok(frame) = FrameRepr::<ControlMessage>::parse(data, max) else {
        return;
    };
    assert_eq!(claimed, Ok(Some(data.len())));
    match frame.body {
        ControlMessage::PluginListReply(list) => assert_eq!(list.iter().count(), list.len()),
        ControlMessage::WorkersByGidReply(list) => assert_eq!(list.iter().count(), list.len()),
        ControlMessage::SpawnWorker(spawn) => assert_eq!(spawn.env.iter().count(), spawn.env.len()),
        ControlMessage::StatusReply(reply) => {
            assert_eq!(reply.records.iter().count(), reply.records.len())
        }
        _ => {}
    }
    let mut out = vec![0xa5; data.len()];
    let written = frame
        .emit(&mut out, max)
        .expect("a parsed frame emits again");
    assert_eq!(&out[..written], data);
});
