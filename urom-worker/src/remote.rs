//! Hosts on other machines: the worker opens a front door (a TCP socket) beside its Unix
//! socket, lets in only hosts that prove the key its daemon gave it, and only then connects to
//! them over UCX.

use std::io::Read;
use std::os::unix::fs::MetadataExt;

use urom_contract::worker_command::UcxListen;
use urom_transport::auth::{AUTH_KEY_LEN, SharedSecret};
use urom_wire::MaxMsgSize;

use crate::{Worker, WorkerRunError};

/// Reads the worker key (and removes its file), listens over UCX, and writes the address it
/// listens on where the daemon looks for it.
pub(crate) fn listen(
    worker: &mut Worker,
    ucx: &UcxListen,
    id: u64,
    max: MaxMsgSize,
) -> Result<(), WorkerRunError> {
    let key = read_key(ucx)?;
    listen_with(worker, ucx, key, id, max)
}

#[cfg(feature = "ucx")]
fn listen_with(
    worker: &mut Worker,
    ucx: &UcxListen,
    key: SharedSecret,
    id: u64,
    max: MaxMsgSize,
) -> Result<(), WorkerRunError> {
    use urom_transport::ChannelConfig;

    let cannot_listen =
        |e: std::io::Error| WorkerRunError::Ucx(format!("cannot listen on {}: {e}", ucx.address));
    let listener = std::net::TcpListener::bind(ucx.address).map_err(cannot_listen)?;
    let bound = listener.local_addr().map_err(cannot_listen)?;
    // Written whole under another name first, so that the daemon never reads half of it.
    let staged = ucx.address_file.with_extension("partial");
    std::fs::write(&staged, bound.to_string())
        .and_then(|()| std::fs::rename(&staged, &ucx.address_file))
        .map_err(|e| {
            WorkerRunError::Ucx(format!("cannot write {}: {e}", ucx.address_file.display()))
        })?;
    tracing::info!(address = %bound, "accepting hosts on other machines");
    worker.listen_ucx(
        listener,
        ChannelConfig::new(max),
        key,
        urom_transport::auth::worker_identity(id),
    );
    Ok(())
}

#[cfg(not(feature = "ucx"))]
fn listen_with(
    _: &mut Worker,
    _: &UcxListen,
    _: SharedSecret,
    _: u64,
    _: MaxMsgSize,
) -> Result<(), WorkerRunError> {
    Err(WorkerRunError::Ucx(
        "this urom-worker was built without UCX (build it with --features ucx)".into(),
    ))
}

/// The key in `ucx.key_file`: exactly [`AUTH_KEY_LEN`] bytes in a file only this user may
/// read. The file is removed once read, so that the key lives only in this process.
fn read_key(ucx: &UcxListen) -> Result<SharedSecret, WorkerRunError> {
    let path = &ucx.key_file;
    let bad = |why: String| WorkerRunError::Ucx(format!("key file {}: {why}", path.display()));
    let mut file = std::fs::File::open(path).map_err(|e| bad(e.to_string()))?;
    let mode = file.metadata().map_err(|e| bad(e.to_string()))?.mode();
    if mode & 0o077 != 0 {
        return Err(bad(format!(
            "readable by other users (mode {:o})",
            mode & 0o777
        )));
    }
    let mut key = Vec::with_capacity(AUTH_KEY_LEN);
    file.by_ref()
        .take(AUTH_KEY_LEN as u64 + 1)
        .read_to_end(&mut key)
        .map_err(|e| bad(e.to_string()))?;
    let _ = std::fs::remove_file(path);
    if key.len() != AUTH_KEY_LEN {
        return Err(bad(format!(
            "holds {} bytes, not a {AUTH_KEY_LEN}-byte key",
            key.len()
        )));
    }
    Ok(SharedSecret::from_bytes(&key))
}
