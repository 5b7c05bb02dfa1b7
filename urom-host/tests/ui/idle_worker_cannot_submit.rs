use urom_host::{Idle, Worker};

fn main() {
    // Commands need a running worker.
    let _ = Worker::<Idle>::new().submit(1, |_| 0);
}
