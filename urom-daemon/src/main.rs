//! `urom-daemon`: see the library documentation, or run `urom-daemon --help`.

use std::process::ExitCode;

fn main() -> ExitCode {
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if argv.len() == 3 && argv[1] == urom_daemon::discovery::PROBE_FLAG {
        return urom_daemon::discovery::probe_main(std::path::Path::new(&argv[2]));
    }
    let args = match urom_daemon::Args::parse_with_json(argv) {
        Ok(args) => args,
        Err(urom_daemon::ArgsError::Clap(e)) => e.exit(),
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    match urom_daemon::run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("urom-daemon: {e}");
            ExitCode::FAILURE
        }
    }
}
