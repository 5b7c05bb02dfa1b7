use urom_host::{Idle, Worker};

fn main() {
    // An idle worker has not been given an id by the service yet.
    let _ = Worker::<Idle>::new().id();
}
