//! `deploy/redis-cluster.sh`, the shipped Redis Cluster set-up, run as docs/deploy.md says:
//! `up` gives a 3-primary cluster of real redis-servers and the line that points vq at it;
//! `vq serve` and the operator commands work on it, a target's keys on one node and targets
//! spread over the nodes; `down` stops every node it started.

use std::process::{Command, Output};
use std::time::Duration;

use crate::support::{VqProcess, vq_command, wait_until};

fn script(dir: &std::path::Path, action: &str) -> Output {
    Command::new(format!("{}/deploy/redis-cluster.sh", env!("CARGO_MANIFEST_DIR")))
        .arg(action)
        .env("REDIS_CLUSTER_DIR", dir)
        .output()
        .expect("run deploy/redis-cluster.sh")
}

/// `down` on drop, so a failed assertion leaves no node behind.
struct Up(tempfile::TempDir);

impl Drop for Up {
    fn drop(&mut self) {
        let _ = script(self.0.path(), "down");
    }
}

/// The PIDs `up` recorded, one per node.
fn node_pids(dir: &std::path::Path) -> Vec<u32> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".pid"))
        .map(|e| std::fs::read_to_string(e.path()).unwrap().trim().parse().unwrap())
        .collect()
}

fn alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default().contains(") Z ")
}

#[tokio::test]
async fn the_shipped_redis_cluster_serves_vq_and_stops_cleanly() {
    let up = Up(tempfile::tempdir().unwrap());
    let out = script(up.0.path(), "up");
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "up failed: {said}{}", String::from_utf8_lossy(&out.stderr));
    let nodes = said
        .lines()
        .find_map(|l| l.strip_prefix("VQ_REDIS__CLUSTER_NODES="))
        .unwrap_or_else(|| panic!("no VQ_REDIS__CLUSTER_NODES line: {said}"))
        .to_owned();
    let ports: Vec<u16> = nodes.split(',').map(|n| n.rsplit(':').next().unwrap().parse().unwrap()).collect();
    assert_eq!(ports.len(), 3, "{nodes}");
    let pids = node_pids(up.0.path());
    assert_eq!(pids.len(), 3);

    let cluster = [("VQ_REDIS__CLUSTER_NODES", nodes.clone())];
    let vq = VqProcess::serve_env(&cluster).await;
    let flag = vq_command().args(["flag", "on"]).envs(cluster.iter().cloned()).output().unwrap();
    assert!(flag.status.success(), "vq flag on: {}", String::from_utf8_lossy(&flag.stderr));
    let client = reqwest::Client::new();
    for id in 1..=8 {
        let r = client
            .post(format!("{}/virtual-queues/limited-drop/{id}/entries", vq.addr))
            .header("X-User-Id", "7")
            .send()
            .await
            .unwrap();
        let body: serde_json::Value = r.json().await.unwrap();
        assert_eq!(body["status"], "WAITING", "limited-drop:{id} queues on the cluster: {body}");
    }
    // Each target's keys on one node; the targets spread over the primaries.
    let mut holding = 0;
    for port in &ports {
        let mut c = redis::Client::open(format!("redis://127.0.0.1:{port}")).unwrap();
        let keys: Vec<String> = redis::cmd("KEYS").arg("queue:{LIMITED_DROP:*}:waiting").query(&mut c).unwrap();
        holding += usize::from(!keys.is_empty());
    }
    assert!(holding >= 2, "8 targets all on one node");
    let stats =
        vq_command().args(["stats", "--target", "limited-drop:3"]).envs(cluster.iter().cloned()).output().unwrap();
    assert!(stats.status.success(), "vq stats: {}", String::from_utf8_lossy(&stats.stderr));
    drop(vq);

    let down = script(up.0.path(), "down");
    assert!(down.status.success(), "{}", String::from_utf8_lossy(&down.stderr));
    wait_until(Duration::from_secs(5), &format!("every node of {pids:?} ended by down"), async || {
        pids.iter().all(|pid| !alive(*pid))
    })
    .await;
}
