//! The container files, checked without a container engine: every vq command line that
//! `deploy/compose.yml` and `docs/deploy.md` run or document is a valid vq command given the
//! image's `ENTRYPOINT` in the `Dockerfile` (the entry point is `vq`, so `run --rm vq1 vq flag
//! on` would run `vq vq flag on`), and the compose header says why its curl answers 400.

use clap::Parser;

fn read(path: &str) -> String {
    std::fs::read_to_string(format!("{}/{path}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

/// A Dockerfile exec-form instruction (`ENTRYPOINT ["vq"]`) as its words.
fn exec_form(dockerfile: &str, instruction: &str) -> Vec<String> {
    let line = dockerfile
        .lines()
        .find_map(|l| l.strip_prefix(instruction).map(str::trim))
        .unwrap_or_else(|| panic!("no {instruction} in the Dockerfile"));
    serde_json::from_str(line).unwrap_or_else(|e| panic!("{instruction} {line} is not the exec form: {e}"))
}

/// Arguments split as a shell would for the simple lines documented (quotes, no expansions).
fn words(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quote = None;
    for c in line.chars() {
        match (quote, c) {
            (None, '#') => break,
            (None, '\'' | '"') => quote = Some(c),
            (Some(q), c) if c == q => quote = None,
            (None, c) if c.is_whitespace() => {
                if !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                }
            }
            (_, c) => cur.push(c),
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

fn assert_vq_command(argv: &[String], from: &str) {
    if let Err(e) = vq::cli::Cli::try_parse_from(argv) {
        panic!("{from}: `{}` is not a vq command: {e}", argv.join(" "));
    }
}

#[test]
fn every_documented_compose_run_is_a_vq_command_given_the_entry_point() {
    let entrypoint = exec_form(&read("Dockerfile"), "ENTRYPOINT");
    assert_eq!(entrypoint, ["vq"]);
    let mut cmd = entrypoint.clone();
    cmd.extend(exec_form(&read("Dockerfile"), "CMD"));
    assert_vq_command(&cmd, "Dockerfile CMD");

    let compose = read("deploy/compose.yml");
    let services = ["vq1", "vq2", "vq3"];
    let mut checked = 0;
    for (file, text) in [("deploy/compose.yml", compose.as_str()), ("docs/deploy.md", &read("docs/deploy.md"))] {
        for line in text.lines() {
            let w = words(line.trim_start_matches('#'));
            let Some(run) = w.iter().position(|x| x == "run") else { continue };
            if !w.iter().take(2).eq(["docker", "compose"].iter()) {
                continue;
            }
            let rest: Vec<&String> = w[run + 1..].iter().skip_while(|a| a.starts_with('-')).collect();
            let Some((service, args)) = rest.split_first() else { continue };
            if !services.contains(&service.as_str()) {
                continue;
            }
            let mut argv = entrypoint.clone();
            argv.extend(args.iter().map(|a| a.to_string()));
            assert_vq_command(&argv, &format!("{file}: {line}"));
            checked += 1;
        }
    }
    assert!(checked >= 2, "the documented `docker compose run` lines were found ({checked})");

    // `command:` of a vq service overrides CMD, after the same entry point.
    let mut service = "";
    for line in compose.lines() {
        if let Some(name) = line.strip_prefix("  ").and_then(|l| l.strip_suffix(':')).filter(|n| !n.starts_with(' ')) {
            service = name;
        }
        if services.contains(&service)
            && let Some(command) = line.trim().strip_prefix("command:")
        {
            let mut argv = entrypoint.clone();
            argv.extend(
                words(command.trim().trim_matches(|c| c == '[' || c == ']')).into_iter().map(|a| a.replace(',', "")),
            );
            assert_vq_command(&argv, &format!("deploy/compose.yml {service}: {line}"));
        }
    }
}

#[test]
fn the_compose_header_says_its_curl_answers_400_until_the_auth_layer_is_filled() {
    let compose = read("deploy/compose.yml");
    let header: String =
        compose.lines().take_while(|l| l.starts_with('#') || l.is_empty()).collect::<Vec<_>>().join("\n");
    assert!(header.contains("curl "), "{header}");
    assert!(header.contains("400") && header.contains("AUTH LAYER"), "the curl's 400 is explained: {header}");
    let nginx = read("deploy/nginx/vq.conf");
    assert!(nginx.contains("AUTH LAYER") && nginx.contains("set $vq_user_id \"\";"), "the block it names exists");
}
