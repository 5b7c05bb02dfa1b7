//! `urom-ctl`: see the library documentation, or run `urom-ctl --help`.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let args = urom_ctl::Args::parse();
    let stop = urom_ctl::stop_flag();
    let mut out = std::io::stdout().lock();
    match urom_ctl::run(&args, &mut out, &stop) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("urom-ctl: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}
