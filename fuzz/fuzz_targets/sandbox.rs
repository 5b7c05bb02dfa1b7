//! The sandbox plugin's decoders: any bytes either fail with an error or unpack to a command or
//! notification that packs to bytes unpacking to the same value (padding the C structs leave
//! undefined is written as zeros), at the length it says, without writing past it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use urom_wire::sandbox::{SandboxCommand, SandboxNotification};

fuzz_target!(|data: &[u8]| {
    let mut out = vec![0xa5u8; data.len() + 1];
    if let Ok(command) = SandboxCommand::unpack(data) {
        let written = command.pack(&mut out).expect("a command packs again");
        assert_eq!(written, data.len());
        assert_eq!(written, command.buffer_len());
        assert_eq!(out[written], 0xa5, "wrote past its end");
        assert_eq!(SandboxCommand::unpack(&out[..written]), Ok(command));
    }
    out.fill(0xa5);
    if let Ok(notification) = SandboxNotification::unpack(data) {
        let written = notification
            .pack(&mut out)
            .expect("a notification packs again");
        assert_eq!(written, data.len());
        assert_eq!(out[written], 0xa5, "wrote past its end");
        assert_eq!(
            SandboxNotification::unpack(&out[..written]),
            Ok(notification)
        );
    }
});
