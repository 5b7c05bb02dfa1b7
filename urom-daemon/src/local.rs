//! Hosts on this machine: the daemon's Unix socket. Each accepted connection's user is read
//! (`SO_PEERCRED`) at once and the gate's policy applied before any thread is spent on it; an
//! admitted host is served by a session on a thread of its own.

use std::os::unix::net::UnixStream;
use std::sync::Arc;

use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};
use tracing::{error, warn};
use urom_wire::Status;

use crate::Service;
use crate::gate::Peer;
use crate::registry::HostId;
use crate::session;

/// Takes a freshly accepted connection: turns it away at once, or serves it as host `host` on
/// a thread of its own.
pub(crate) fn admit(service: &Arc<Service>, host: HostId, stream: UnixStream) {
    let peer = match getsockopt(&stream, PeerCredentials) {
        Ok(credentials) => Peer {
            uid: credentials.uid(),
            pid: credentials.pid(),
        },
        Err(e) => {
            warn!("cannot read a connecting peer's credentials: {e}; closed");
            return;
        }
    };
    let gate = &service.gate;
    if !gate.allows(peer.uid) {
        let reason = format!("user {} may not use this service", peer.uid);
        let refusal = (Status::Authentication, reason.as_str());
        service
            .gate
            .turn_away(stream, &peer, service.max_msg_size, refusal);
        return;
    }
    let permit = match gate.permit(peer.uid) {
        Ok(permit) => permit,
        Err(reason) => {
            let refusal = (Status::Full, reason.as_str());
            service
                .gate
                .turn_away(stream, &peer, service.max_msg_size, refusal);
            return;
        }
    };
    if let Err(e) = stream.set_nonblocking(false) {
        warn!("cannot set up a host connection: {e}; closed");
        return;
    }
    let halves = match urom_transport::stream::split_unix(stream) {
        Ok(halves) => halves,
        Err(e) => {
            warn!("cannot set up a host connection: {e}; closed");
            return;
        }
    };
    let session_service = Arc::clone(service);
    let client = session::Client::Local(peer);
    let spawned = std::thread::Builder::new()
        .name(format!("urom-host-{host}"))
        .spawn(move || session::serve(&session_service, host, halves, client, (permit, None)));
    if let Err(e) = spawned {
        error!("cannot serve a host: {e}");
    }
}
