//! `urom-worker`: see the library documentation, or run `urom-worker --help`.

use clap::Parser;

fn main() -> anyhow::Result<()> {
    let args = urom_worker::Args::parse();
    urom_worker::run(args)?;
    Ok(())
}
