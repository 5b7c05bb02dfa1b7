use urom_host::{Running, Service};

fn reconfigure(service: Service<Running>) {
    // Settings belong to the idle service; stop it first.
    let _ = service.set_socket("/run/urom/other.sock");
}

fn main() {}
