//! Domains for tests: tables that tests hand a worker or a plugin themselves, and a one-rank
//! domain started through the host API.

use urom_wire::domain::{RecordSpec, TableRepr};

/// The table bytes of `records`, in rank order as given (what a host sends its workers).
pub fn table_bytes(records: &[RecordSpec<'_>]) -> Vec<u8> {
    let records: Vec<Vec<u8>> = records
        .iter()
        .map(|spec| {
            let mut bytes = vec![0; spec.buffer_len()];
            spec.emit(&mut bytes).expect("a record fits its own length");
            bytes
        })
        .collect();
    let slices: Vec<&[u8]> = records.iter().map(Vec::as_slice).collect();
    let mut table = vec![0; TableRepr::buffer_len(&slices)];
    TableRepr::emit(&slices, &mut table).expect("a table fits its own length");
    table
}

// The host library is built without its host API under loom.
#[cfg(not(loom))]
/// Starts a domain of one rank (this host) over `workers`, with domain ids 0, 1, ... in order,
/// its rendezvous socket in `dir`, and waits until it runs (at most `timeout` for each step).
pub fn start_one_rank(
    engine: &mut urom_host::ProgressEngine,
    dir: &std::path::Path,
    workers: &[&urom_host::Worker<urom_host::Running>],
    timeout: std::time::Duration,
) -> urom_host::Domain<urom_host::Running> {
    use urom_host::Domain;
    use urom_host::oob::{RendezvousAddr, SocketOob};
    let oob = SocketOob::join(
        &RendezvousAddr::Unix(dir.join("rendezvous.sock")),
        1,
        0,
        timeout,
    )
    .expect("a rendezvous of one rank");
    let ids: Vec<u64> = (0..workers.len() as u64).collect();
    Domain::new()
        .set_oob(oob)
        .set_workers(&ids, workers)
        .map_err(|(_, error)| error)
        .expect("the domain's workers")
        .start(engine)
        .map_err(|(_, error)| error)
        .expect("starting the domain")
        .wait_running(engine, timeout)
        .unwrap_or_else(|progress| panic!("the domain did not run: {progress:?}"))
}
