//! The collective plugin's decoders: any bytes either fail with an error or parse to a command
//! or notification that emits back to exactly the same bytes, and nothing past them.
#![no_main]

use libfuzzer_sys::fuzz_target;
use urom_coll_wire::{CollCommand, CollNotification};

fuzz_target!(|data: &[u8]| {
    let mut out = [0xa5u8; 4096 + 1];
    if let Ok(command) = CollCommand::parse(data) {
        let written = command.emit(&mut out).expect("a command emits again");
        assert_eq!(&out[..written], data);
        assert_eq!(out[written], 0xa5, "wrote past its end");
    }
    if let Ok(notification) = CollNotification::parse(data) {
        let written = notification
            .emit(&mut out)
            .expect("a notification emits again");
        assert_eq!(&out[..written], data);
    }
});
