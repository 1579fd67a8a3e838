//! Output of commands that exit while the agent is busy (here: spawning a
//! burst of other commands on the same connection) is never lost: a
//! command's pipes are read to their end before its result is sent, even
//! when its exit was seen long before its pipes were next polled.

mod common;

use agent_client::{AsyncClient, Config, ExecRequest, Transport};
use common::Agent;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_of_a_burst_keeps_its_output() {
    let agent = Agent::start();
    let c = AsyncClient::connect(&Transport::Unix(agent.sock.clone()), Config::default())
        .await
        .expect("connect to the agent");
    for round in 0..3 {
        // Two waves: the second's spawns keep the agent busy while the
        // first wave's commands exit.
        let mut tasks = Vec::new();
        for wave in 0..2 {
            for i in 0..250 {
                let c = c.clone();
                let word = format!("r{round}w{wave}n{i}");
                tasks.push(tokio::spawn(async move {
                    let out = c.exec_simple(&ExecRequest::argv(["echo", &word])).await;
                    (word, out)
                }));
            }
            tokio::time::sleep(std::time::Duration::from_millis(30)).await;
        }
        let mut lost = vec![];
        for t in tasks {
            let (word, out) = t.await.unwrap();
            let out = out.unwrap_or_else(|e| panic!("exec {word}: {e}"));
            assert!(out.result.success(), "{word}: {:?}", out.result);
            if out.stdout != format!("{word}\n").as_bytes() {
                lost.push((word, String::from_utf8_lossy(&out.stdout).into_owned()));
            }
        }
        assert!(
            lost.is_empty(),
            "round {round}: output lost or wrong: {lost:?}"
        );
    }
}
