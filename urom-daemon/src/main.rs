//! `urom-daemon`: see the library documentation, or run `urom-daemon --help`.

use std::process::ExitCode;

use urom_daemon::JsonArgs;

fn main() -> ExitCode {
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if argv.len() == 3 && argv[1] == urom_daemon::discovery::PROBE_FLAG {
        return urom_daemon::discovery::probe_main(std::path::Path::new(&argv[2]));
    }
    let args = match urom_daemon::Args::parse_with_json(argv) {
        Ok(args) => args,
        Err(urom_daemon::ArgsError::Clap(e)) if !e.use_stderr() => e.exit(),
        Err(urom_daemon::ArgsError::Clap(e)) => {
            // One line naming the option and what it accepts; --help has the rest.
            let text = e.to_string();
            eprintln!(
                "urom-daemon: {}",
                text.lines()
                    .next()
                    .unwrap_or_default()
                    .trim_start_matches("error: ")
            );
            return ExitCode::from(2);
        }
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
