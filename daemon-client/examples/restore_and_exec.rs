//! Restore a sandbox from a template, run a command in it, print its
//! output, remove it. Talks to the shoald on `SHOAL_DAEMON` (a socket path
//! or http://HOST:PORT with SHOAL_TOKEN), else the local default socket.
//!
//! cargo run -p shoal-client --example restore_and_exec -- [TEMPLATE [CMD...]]

use shoal_client::{api, DaemonClient};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let template = args.next().unwrap_or_else(|| "example-tiny".into());
    let cmd: Vec<String> = args.collect();
    let c = DaemonClient::from_env();
    // The template: registered once (the image is booted and snapshotted).
    let mut t = match c.template(&template) {
        Err(e) if e.is_not_found() => {
            c.create_template(&api::CreateTemplate::new(&template, "tiny"))?
        }
        other => other?,
    };
    while t.state == api::TemplateState::Building {
        std::thread::sleep(std::time::Duration::from_millis(500));
        t = c.template(&template)?;
    }
    // Restore a sandbox from it, run the command, remove the sandbox.
    let sb = c.create(&api::CreateSandbox::from_template(&template))?;
    let req = match cmd.is_empty() {
        true => api::ExecRequest::shell("uname -a; echo hello from $(hostname)"),
        false => api::ExecRequest::argv(cmd),
    };
    let out = c.exec(&sb.id, &req);
    c.kill(&sb.id)?;
    let out = out?;
    std::io::Write::write_all(&mut std::io::stdout(), &out.stdout_bytes()?)?;
    std::io::Write::write_all(&mut std::io::stderr(), &out.stderr_bytes()?)?;
    std::process::exit(out.code());
}
