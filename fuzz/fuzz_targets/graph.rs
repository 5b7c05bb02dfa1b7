//! The graph plugin's decoders: any bytes either fail with an error or unpack to a command or
//! notification that packs back to exactly the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use urom_graph_wire::{GraphCommand, GraphNotification, MESSAGE_LEN};

fuzz_target!(|data: &[u8]| {
    let mut out = [0xa5u8; MESSAGE_LEN + 1];
    if let Ok(command) = GraphCommand::unpack(data) {
        let written = command.pack(&mut out).expect("a command packs again");
        assert_eq!(&out[..written], data);
        assert_eq!(out[written], 0xa5, "wrote past its end");
    }
    if let Ok(notification) = GraphNotification::unpack(data) {
        let written = notification
            .pack(&mut out)
            .expect("a notification packs again");
        assert_eq!(&out[..written], data);
    }
});
