//! The node workers' network over UCX: [`internode::Net`](crate::internode::Net) on the
//! plugin SDK's `PeerWorker` (tagged messages, endpoints by address with peer error handling,
//! the UCP worker's event descriptor to sleep on).

use std::os::fd::BorrowedFd;

use urom_plugin::ucx::{OperationKind, PeerId, PeerWorker};

use crate::internode::{Net, NetError, OnDone};

/// UCX tagged messages between node workers.
pub struct UcxNet {
    worker: PeerWorker,
    peers: Vec<PeerId>,
}

impl UcxNet {
    /// A UCP worker of the plugin's own.
    pub fn new() -> Result<Self, String> {
        Ok(Self {
            worker: PeerWorker::new().map_err(|e| e.to_string())?,
            peers: Vec::new(),
        })
    }
}

impl Net for UcxNet {
    fn connect(&mut self, address: &[u8]) -> Result<usize, NetError> {
        let peer = self.worker.connect(address).map_err(|_| NetError)?;
        self.peers.push(peer);
        Ok(self.peers.len() - 1)
    }

    fn failed(&self, peer: usize) -> bool {
        self.peers
            .get(peer)
            .is_none_or(|&p| self.worker.peer_failure(p).is_some())
    }

    fn send(&mut self, peer: usize, tag: u64, data: &[u8], token: u64) -> Result<(), NetError> {
        let peer = *self.peers.get(peer).ok_or(NetError)?;
        self.worker
            .tag_send(peer, tag, data, token)
            .map(drop)
            .map_err(|_| NetError)
    }

    fn recv(&mut self, tag: u64, mask: u64, capacity: usize, token: u64) {
        self.worker.tag_recv(tag, mask, capacity, token);
    }

    fn poll(&mut self, f: &mut OnDone<'_>) -> bool {
        let mut any = false;
        while let Some(done) = self.worker.progress() {
            any = true;
            let outcome = match (done.result, done.kind) {
                (Err(_), _) => Err(NetError),
                (Ok(()), OperationKind::Receive { .. }) => Ok(Some(self.worker.slot(done.slot))),
                (Ok(()), _) => Ok(None),
            };
            f(done.token, outcome);
            self.worker.release(done.slot);
        }
        any
    }

    fn address(&self) -> &[u8] {
        self.worker.address()
    }

    fn arm(&mut self) -> bool {
        self.worker.arm()
    }

    fn wake_fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.worker.wake_fd())
    }
}
