use urom_host::{Starting, Worker};

fn send(worker: Worker<Starting>) {
    // A starting worker must be progressed to running first.
    let _ = worker.submit(1, |_| 0);
}

fn main() {}
