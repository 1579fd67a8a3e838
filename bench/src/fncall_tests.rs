use super::*;

fn level(system: &str, k: usize, passed: usize, calls_per_s: f64, p50: f64) -> SystemLevel {
    let samples = vec![p50; 4];
    SystemLevel {
        system: system.into(),
        concurrency: k,
        calls: 4,
        passed,
        errors: 0,
        failures: vec![],
        calls_per_s,
        latency_ms: summarize(&samples),
        cpu_ms_per_call: Some(50.0),
        calls_per_core_s: Some(20.0),
        samples,
    }
}

#[test]
fn the_program_is_human_evals() {
    assert_eq!(
        program(
            "def f():\n",
            "    return 1\n",
            "def check(c):\n    assert c() == 1\n",
            "f"
        ),
        "def f():\n    return 1\n\ndef check(c):\n    assert c() == 1\n\ncheck(f)\n"
    );
}

#[test]
fn loads_plain_and_gzipped_jsonl() {
    let d = tempfile::tempdir().unwrap();
    let line = serde_json::json!({"task_id": "HumanEval/0", "prompt": "def f():\n",
        "canonical_solution": "    return 1\n", "test": "def check(c):\n    assert c() == 1\n",
        "entry_point": "f"});
    let plain = d.path().join("he.jsonl");
    std::fs::write(&plain, format!("{line}\n\n{line}\n")).unwrap();
    let ps = load_humaneval(&plain).unwrap();
    assert_eq!(ps.len(), 2);
    assert_eq!(ps[0].task_id, "HumanEval/0");
    assert!(ps[0].program.ends_with("check(f)\n"));
    let st = std::process::Command::new("gzip")
        .arg("-k")
        .arg(&plain)
        .status()
        .unwrap();
    assert!(st.success());
    assert_eq!(load_humaneval(&d.path().join("he.jsonl.gz")).unwrap(), ps);
    std::fs::write(&plain, "{\"task_id\": 1}\n").unwrap();
    let e = load_humaneval(&plain).unwrap_err().to_string();
    assert!(e.contains("line 1") && e.contains("task_id"), "{e}");
    std::fs::write(&plain, "").unwrap();
    assert!(load_humaneval(&plain).is_err());
}

#[test]
fn ratios_and_goals() {
    let r = report(
        Path::new("he.jsonl"),
        4,
        vec![
            level(FNCALL, 1, 4, 20.0, 80.0),
            level(RESTORE_EXEC, 1, 4, 1.0, 900.0),
            level(HOST, 1, 4, 40.0, 40.0),
            level(FNCALL, 4, 3, 50.0, 150.0),
            level(RESTORE_EXEC, 4, 4, 4.0, 1000.0),
            level(HOST, 4, 4, 100.0, 45.0),
        ],
    );
    assert_eq!(r.ratios.len(), 2);
    assert_eq!(r.ratios[0].vs_restore_exec, Some(20.0));
    assert_eq!(r.ratios[0].vs_host, Some(0.5));
    assert_eq!(r.ratios[0].p50_vs_host, Some(2.0));
    assert_eq!(r.ratios[1].vs_restore_exec, Some(12.5));
    assert!(!r.goals.all_pass, "one level passed 3 of 4");
    assert_eq!(r.goals.ten_x_restore_exec, Some(true));
    assert_eq!(r.goals.p50_le_100ms, Some(true));
    let t = r.render();
    assert!(t.contains("restore+exec") && t.contains("20.00x"), "{t}");
    // Figures: throughput, latency, the CDF at the highest level.
    let d = tempfile::tempdir().unwrap();
    let files = r
        .plot(&crate::plot::Out::for_json(
            d.path(),
            Path::new("bench-fncall.json"),
        ))
        .unwrap();
    let names: Vec<String> = files
        .iter()
        .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        [
            "bench-fncall-throughput.png",
            "bench-fncall-latency.png",
            "bench-fncall-cdf.png"
        ]
    );
    assert!(files
        .iter()
        .all(|f| std::fs::metadata(f).unwrap().len() > 1000));
}

#[test]
fn levels_run_every_problem_once_and_count_cpu() {
    let problems: Vec<Problem> = (0..10)
        .map(|i| Problem {
            task_id: format!("T/{i}"),
            program: format!("{i}"),
        })
        .collect();
    let cpu = || Some(0.0);
    let l = level_for_tests(&problems, &cpu);
    assert_eq!((l.calls, l.passed, l.errors), (10, 5, 5));
    assert_eq!(l.failures.len(), 5);
    assert!(l.failures[0].starts_with("T/1: odd"), "{:?}", l.failures);
    assert_eq!(l.cpu_ms_per_call, Some(0.0));
    assert_eq!(l.calls_per_core_s, None);
}

fn level_for_tests(problems: &[Problem], cpu: &dyn Fn() -> Option<f64>) -> SystemLevel {
    super::level("t", 3, problems, cpu, &|p| {
        let n: usize = p.program.parse().unwrap();
        Outcome {
            passed: n.is_multiple_of(2),
            ms: 1.0,
            error: (!n.is_multiple_of(2)).then(|| "odd".to_string()),
        }
    })
}

#[test]
fn the_daemons_cpu_is_read_from_proc() {
    let me = std::process::id();
    let a = proc_cpu_s(me).unwrap();
    let t = Instant::now();
    let mut x = 0u64;
    while t.elapsed() < Duration::from_millis(100) {
        x = x.wrapping_add(std::hint::black_box(1));
    }
    assert!(x > 0);
    let b = proc_cpu_s(me).unwrap();
    assert!(b > a, "{a} -> {b}");
    assert_eq!(proc_cpu_s(u32::MAX), None);
}
