//! Reads the results of `urom-coll-bench` rounds (tab-separated, see `urom_coll_bench::record`),
//! prints the medians and the medians of the per-round ratios urom / Open MPI per collective and
//! size, and with `--svg PATH` draws overlap and latency against message size. `--ours IMPL`
//! compares another implementation of the results with Open MPI (default `urom`; the MPI
//! benchmark's `openmpi+urom_mpi`).
//!
//! usage: urom-coll-report RESULTS.tsv [--svg PATH] [--title TEXT] [--ours IMPL]

use anyhow::{Context, bail};
use urom_coll_bench::{chart, record::Row, report};

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let (mut input, mut svg, mut title) = (None, None, String::new());
    let mut ours = report::OURS.to_string();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--svg" => svg = Some(args.next().context("--svg needs a path")?),
            "--title" => title = args.next().context("--title needs a text")?,
            "--ours" => ours = args.next().context("--ours needs an implementation name")?,
            "-h" | "--help" => {
                println!(
                    "usage: urom-coll-report RESULTS.tsv [--svg PATH] [--title TEXT] [--ours IMPL]"
                );
                return Ok(());
            }
            _ if input.is_none() => input = Some(arg),
            _ => bail!("unexpected argument {arg:?}"),
        }
    }
    let input = input
        .context("usage: urom-coll-report RESULTS.tsv [--svg PATH] [--title TEXT] [--ours IMPL]")?;
    let text = std::fs::read_to_string(&input).with_context(|| format!("reading {input}"))?;
    let rows = Row::parse_all(&text)
        .map_err(anyhow::Error::msg)
        .with_context(|| format!("in {input}"))?;
    if rows.is_empty() {
        bail!("{input}: no results");
    }
    let summaries = report::summarise_as(&rows, &ours);
    print!("{}", report::table(&summaries));
    if let Some(svg) = svg {
        chart::write_svg(svg.as_ref(), &summaries, &title)
            .map_err(anyhow::Error::msg)
            .with_context(|| format!("writing {svg}"))?;
        println!("chart: {svg}");
    }
    Ok(())
}
