//! Lists every backend Genesis finds, with its origin, versions and availability.
//!
//! `cargo run --release --example backends`

fn main() {
    let found = genesis::backends();
    println!("Genesis {} (backend interface {})", env!("CARGO_PKG_VERSION"), genesis::API_VERSION);
    println!("{:<10} {:<9} {:<8} {:<10} {:<8} origin / reason", "backend", "status", "devices", "interface", "plugin");
    for b in &found {
        let status = match (b.available, b.shadowed) {
            (_, true) => "shadowed",
            (true, false) => "available",
            (false, false) => "unavail.",
        };
        let api = b.api_version.map_or("-".to_string(), |v| v.to_string());
        let version = b.plugin_version.clone().unwrap_or_else(|| "-".into());
        println!("{:<10} {:<9} {:<8} {:<10} {:<8} {}", b.name, status, b.device_count, api, version, b.origin);
        if let Some(reason) = &b.reason {
            println!("{:<10} {:<9} {:<8} {:<10} {:<8}   ({reason})", "", "", "", "", "");
        }
        if let Some(description) = b.description.as_ref().filter(|_| b.available) {
            println!("{:<10} {description}", "");
        }
    }
    match genesis::Device::parse("cpu") {
        Ok(cpu) => println!("\n\"cpu\" resolves to {} from {}", cpu, cpu.backend().origin()),
        Err(e) => println!("\n\"cpu\" does not resolve: {e}"),
    }
}
