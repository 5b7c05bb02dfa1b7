//! Hosts on this machine: the daemon's Unix socket. Each accepted connection's user is read
//! (`SO_PEERCRED`) at once and the gate's policy applied before anything is spent on it; an
//! admitted host is served by a session in the event loop.

use std::sync::Arc;

use mio::net::UnixStream;
use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};
use tracing::warn;
use urom_wire::Status;

use crate::Service;
use crate::event_loop::LoopWake;
use crate::gate::Peer;
use crate::registry::HostId;
use crate::session::{Client, Session};

/// Takes a freshly accepted connection: turns it away at once (the caller closes it), or
/// returns the session that serves it as host `host`.
pub(crate) fn admit(
    service: &Arc<Service>,
    host: HostId,
    stream: &UnixStream,
    wake: &Arc<LoopWake>,
) -> Option<Session> {
    let peer = match getsockopt(stream, PeerCredentials) {
        Ok(credentials) => Peer {
            uid: credentials.uid(),
            pid: credentials.pid(),
        },
        Err(e) => {
            warn!("cannot read a connecting peer's credentials: {e}; closed");
            return None;
        }
    };
    let gate = &service.gate;
    if !gate.allows(peer.uid) {
        let reason = format!("user {} may not use this service", peer.uid);
        let refusal = (Status::Authentication, reason.as_str());
        gate.turn_away(stream, &peer, service.max_msg_size, refusal);
        return None;
    }
    let permit = match gate.permit(peer.uid) {
        Ok(permit) => permit,
        Err(reason) => {
            let refusal = (Status::Full, reason.as_str());
            gate.turn_away(stream, &peer, service.max_msg_size, refusal);
            return None;
        }
    };
    let client = Client::Local(peer);
    Some(Session::new(service, host, client, (permit, None), wake))
}
