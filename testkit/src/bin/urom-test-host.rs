//! Connects to a daemon socket and authenticates, for tests that need a host running as
//! another user. Prints `accepted`, or `refused <status>: <reason>`; exits 0 or 3.

use std::process::ExitCode;
use std::time::Duration;

use urom_testkit::control::ControlClient;

fn main() -> ExitCode {
    let Some(socket) = std::env::args_os().nth(1) else {
        eprintln!("usage: urom-test-host <daemon socket>");
        return ExitCode::from(2);
    };
    let mut client = match ControlClient::connect(socket.as_ref(), Duration::from_secs(10)) {
        Ok(client) => client,
        Err(e) => {
            eprintln!("cannot connect: {e}");
            return ExitCode::FAILURE;
        }
    };
    match client.handshake() {
        Ok(()) => {
            println!("accepted");
            ExitCode::SUCCESS
        }
        Err((status, reason)) => {
            println!("refused {status}: {reason}");
            ExitCode::from(3)
        }
    }
}
