use urom_host::{Idle, Service};

fn main() {
    // The plugin list comes from the daemon when the service starts.
    let _ = Service::<Idle>::new().plugins();
}
