//! The sandbox plugin's decoders: any bytes either fail with an error or unpack to a command or
//! notification that packs to bytes unpacking to the same value (padding the C structs leave
//! undefined is written as zeros), at the length it says, without writing past it. A command
//! packs again in the layout (UCX 1.13's 64 bytes or the later 72) it was read in, and reads
//! back in that layout.
#![no_main]

use libfuzzer_sys::fuzz_target;
use urom_sandbox_wire::{SandboxCommand, SandboxNotification};

fuzz_target!(|data: &[u8]| {
    let mut out = vec![0xa5u8; data.len() + 1];
    if let Ok((command, layout)) = SandboxCommand::unpack_with_layout(data) {
        assert_eq!(SandboxCommand::unpack(data), Ok(command));
        let written = command
            .pack(layout, &mut out)
            .expect("a command packs again");
        assert_eq!(written, data.len());
        assert_eq!(written, command.buffer_len(layout));
        assert_eq!(out[written], 0xa5, "wrote past its end");
        assert_eq!(
            SandboxCommand::unpack_with_layout(&out[..written]),
            Ok((command, layout))
        );
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
