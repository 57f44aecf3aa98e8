#![allow(clippy::result_large_err)] // figment::Jail's closures return figment::Error

use super::*;
use figment::Jail;

#[test]
fn defaults_match_the_spec() {
    Jail::expect_with(|_| {
        let s = Settings::load(None, &Overrides::default()).unwrap();
        assert_eq!(s.listen.to_string(), "127.0.0.1:8080");
        assert_eq!(s.queue.batch_size, 100);
        assert_eq!(s.queue.tick_ms, 2000);
        assert_eq!(s.queue.max_capacity, 100_000);
        assert_eq!(s.token.ttl_s, 300);
        assert_eq!(s.lock_ttl_ms(), 1900);
        assert_eq!(s.threads, 0, "one worker per core unless told otherwise");
        let routes = crate::gate::GateRoutes::compile(&s.gate.routes).unwrap();
        let gated = |p: &str| routes.match_path(&crate::gate::CanonicalPath::parse(p).unwrap());
        assert_eq!(gated("/limited-drops/42/orders"), Some(Ok("LIMITED_DROP:42".parse().unwrap())));
        assert_eq!(gated("/events/7/seats/select"), Some(Ok("TICKETING_EVENT:7".parse().unwrap())));
        Ok(())
    });
}

#[test]
fn file_then_env_then_flags() {
    Jail::expect_with(|jail| {
        jail.create_file("vq.toml", "listen = \"127.0.0.1:9000\"\n[queue]\nbatch_size = 50\ntick_ms = 1000\n")?;
        jail.set_env("VQ_QUEUE__BATCH_SIZE", "70");
        jail.set_env("VQ_REDIS__URL", "redis://127.0.0.1:7000");
        jail.set_env("VQ_TOKEN_SECRET", "not a key");
        let s = Settings::load(Some(Path::new("vq.toml")), &Overrides::default()).unwrap();
        assert_eq!(s.queue.batch_size, 70);
        assert_eq!(s.queue.tick_ms, 1000);
        assert_eq!(s.redis.url, "redis://127.0.0.1:7000");
        assert_eq!(s.listen.to_string(), "127.0.0.1:9000");
        let o = Overrides { listen: Some("127.0.0.1:9100".parse().unwrap()) };
        let s = Settings::load(Some(Path::new("vq.toml")), &o).unwrap();
        assert_eq!(s.listen.to_string(), "127.0.0.1:9100");
        Ok(())
    });
}

#[test]
fn target_types_come_from_the_file_with_their_routes_and_defaults() {
    Jail::expect_with(|jail| {
        let types = "[[targets.types]]\nslug = \"limited-drop\"\n\n[[targets.types]]\nslug = \"flash-coupon\"\n\
                     batch_size = 20\nmax_capacity = 500\n";
        let routes = "[[gate.routes]]\nmethod = \"POST\"\npath = \"/coupons/{id}/claim\"\ntarget = \"flash-coupon\"\n";
        jail.create_file("vq.toml", &format!("[targets]\ndeclared = [\"flash-coupon:3\"]\n\n{types}\n{routes}"))?;
        let s = Settings::load(Some(Path::new("vq.toml")), &Overrides::default()).unwrap();
        let coupon = QueueTargetType::from_slug("flash-coupon").unwrap();
        assert_eq!(s.target_types().unwrap(), vec![QueueTargetType::LIMITED_DROP, coupon]);
        assert_eq!((s.type_batch_size(coupon), s.type_max_capacity(coupon)), (20, 500));
        assert_eq!(s.type_batch_size(QueueTargetType::LIMITED_DROP), 100, "queue.batch_size");
        assert_eq!(s.limits().capacity(coupon), 500);
        assert_eq!(s.limits().capacity(QueueTargetType::LIMITED_DROP), 100_000);
        let compiled = crate::gate::GateRoutes::compile(&s.gate.routes).unwrap();
        let path = crate::gate::CanonicalPath::parse("/coupons/3/claim").unwrap();
        assert_eq!(compiled.match_path(&path), Some(Ok("flash-coupon:3".parse().unwrap())));
        assert_eq!(compiled.path_of("flash-coupon:3".parse().unwrap()).as_deref(), Some("/coupons/3/claim"));

        // What the configuration cannot say.
        for (file, says) in [
            ("[targets]\ntypes = []\n", "no type is configured"),
            (&format!("{types}[[targets.types]]\nslug = \"FLASH_COUPON\"\n"), "configured twice"),
            ("[[targets.types]]\nslug = \"flash_coupon\"\n", "not a target type"),
            (
                &format!(
                    "{types}{routes}[[gate.routes]]\nmethod = \"POST\"\npath = \"/x/{{id}}\"\ntarget = \"mega-sale\"\n"
                ),
                "gate.routes (/x/{id}) names the type `mega-sale`, which targets.types does not configure",
            ),
            (
                "[targets]\ndeclared = [\"flash-coupon:3\"]\n",
                "targets.declared / targets.ranges names the type `flash-coupon`",
            ),
            (
                "[[targets.types]]\nslug = \"limited-drop\"\nbatch_size = 0\n",
                "targets.types.limited-drop.batch_size must be between 1 and",
            ),
            ("[[targets.types]]\nslug = \"limited-drop\"\nbatchsize = 5\n", "unknown field"),
        ] {
            jail.create_file("vq.toml", file)?;
            let err = Settings::load(Some(Path::new("vq.toml")), &Overrides::default()).unwrap_err().to_string();
            assert!(err.contains(says), "{file}: {err}");
        }
        Ok(())
    });
}

#[test]
fn adaptive_outflow_settings_are_bounded() {
    Jail::expect_with(|jail| {
        jail.set_env("VQ_QUEUE__OUTFLOW", "adaptive");
        let s = Settings::load(None, &Overrides::default()).unwrap();
        assert_eq!(s.queue.outflow, Outflow::Adaptive);
        let c = s.controller(QueueTargetType::LIMITED_DROP);
        assert_eq!((c.batch_min, c.batch_max), (10, 1000));
        for (key, value, says) in [
            ("VQ_ADAPTIVE__DECREASE", "1.5", "adaptive.decrease (VQ_ADAPTIVE__DECREASE) must be a fraction"),
            ("VQ_ADAPTIVE__ERROR_RATIO", "0", "adaptive.error_ratio"),
            ("VQ_QUEUE__BATCH_MIN", "2000", "queue.batch_max (VQ_QUEUE__BATCH_MAX) must be between 2000 and"),
            ("VQ_QUEUE__OUTFLOW", "auto", "found `auto`, expected"),
        ] {
            jail.set_env(key, value);
            let err = Settings::load(None, &Overrides::default()).unwrap_err().to_string();
            assert!(err.contains(says), "{key}={value}: {err}");
            jail.clear_env();
            jail.set_env("VQ_QUEUE__OUTFLOW", "adaptive");
        }
        Ok(())
    });
}

#[test]
fn a_target_type_may_have_its_own_outflow_and_bounds() {
    Jail::expect_with(|jail| {
        let types = "[[targets.types]]\nslug = \"limited-drop\"\noutflow = \"adaptive\"\nbatch_min = 5\nbatch_max = 50\n\n\
                     [[targets.types]]\nslug = \"ticketing-event\"\n";
        jail.create_file("vq.toml", types)?;
        let s = Settings::load(Some(Path::new("vq.toml")), &Overrides::default()).unwrap();
        let event = QueueTargetType::from_slug("ticketing-event").unwrap();
        assert!(s.is_adaptive(QueueTargetType::LIMITED_DROP) && !s.is_adaptive(event), "queue.outflow is fixed");
        let c = s.controller(QueueTargetType::LIMITED_DROP);
        assert_eq!((c.batch_min, c.batch_max), (5, 50));
        assert_eq!(s.type_batch_bounds(event), (10, 1000), "queue.batch_min / batch_max");
        for (file, says) in [
            ("[[targets.types]]\nslug = \"limited-drop\"\nbatch_min = 60\nbatch_max = 50\n", "batch_max"),
            // Above queue.batch_max (1000) without a ceiling of its own: the clamp would panic.
            ("[[targets.types]]\nslug = \"limited-drop\"\noutflow = \"adaptive\"\nbatch_min = 2000\n", "batch_min"),
            ("[[targets.types]]\nslug = \"limited-drop\"\noutflow = \"auto\"\n", "auto"),
        ] {
            jail.create_file("vq.toml", file)?;
            let err = Settings::load(Some(Path::new("vq.toml")), &Overrides::default()).unwrap_err().to_string();
            assert!(err.contains(says), "{file}: {err}");
        }
        Ok(())
    });
}

#[test]
fn purchase_limits_come_from_the_type_else_the_queue_and_are_bounded() {
    Jail::expect_with(|jail| {
        let file = "[queue]\npurchases_per_user = 5\n\n[[targets.types]]\nslug = \"limited-drop\"\n\
                    purchases_per_admission = 3\n\n[[targets.types]]\nslug = \"ticketing-event\"\n";
        jail.create_file("vq.toml", file)?;
        let s = Settings::load(Some(Path::new("vq.toml")), &Overrides::default()).unwrap();
        let event = QueueTargetType::from_slug("ticketing-event").unwrap();
        let drop = s.type_purchase_limits(QueueTargetType::LIMITED_DROP);
        assert_eq!((drop.per_admission, drop.per_user), (3, 5), "its own per admission, the queue's per user");
        let e = s.type_purchase_limits(event);
        assert_eq!((e.per_admission, e.per_user), (1, 5));
        for (file, says) in [
            ("[queue]\npurchases_per_admission = 0\n", "queue.purchases_per_admission"),
            ("[queue]\npurchases_per_user = 2000000\n", "queue.purchases_per_user"),
            (
                "[[targets.types]]\nslug = \"limited-drop\"\npurchases_per_admission = 5000\n",
                "targets.types.limited-drop.purchases_per_admission",
            ),
        ] {
            jail.create_file("vq.toml", file)?;
            let err = Settings::load(Some(Path::new("vq.toml")), &Overrides::default()).unwrap_err().to_string();
            assert!(err.contains(says), "{file}: {err}");
        }
        Ok(())
    });
}

#[test]
fn cluster_nodes_from_env_switch_to_cluster_mode() {
    Jail::expect_with(|jail| {
        assert_eq!(Settings::load(None, &Overrides::default()).unwrap().redis_cluster_nodes(), None);
        jail.set_env("VQ_REDIS__CLUSTER_NODES", "redis://10.0.0.1:7000, redis://10.0.0.2:7000,");
        let s = Settings::load(None, &Overrides::default()).unwrap();
        assert_eq!(
            s.redis_cluster_nodes(),
            Some(vec!["redis://10.0.0.1:7000".to_owned(), "redis://10.0.0.2:7000".to_owned()])
        );
        jail.set_env("VQ_REDIS__CLUSTER_NODES", " ");
        assert_eq!(Settings::load(None, &Overrides::default()).unwrap().redis_cluster_nodes(), None);
        Ok(())
    });
}

#[test]
fn threads_from_env_and_bounded() {
    Jail::expect_with(|jail| {
        jail.set_env("VQ_THREADS", "1");
        assert_eq!(Settings::load(None, &Overrides::default()).unwrap().threads, 1);
        jail.set_env("VQ_THREADS", "5000");
        let err = Settings::load(None, &Overrides::default()).unwrap_err();
        assert!(err.to_string().contains("threads (VQ_THREADS) must be between 0 and 1024"), "{err}");
        jail.set_env("VQ_THREADS", "two");
        assert!(Settings::load(None, &Overrides::default()).is_err());
        Ok(())
    });
}

#[test]
fn the_record_is_kept_record_ttl_days_and_the_store_gets_it_in_seconds() {
    Jail::expect_with(|jail| {
        let s = Settings::load(None, &Overrides::default()).unwrap();
        assert_eq!((s.queue.record_ttl_days, s.limits().record_ttl_s), (30, 30 * 86_400));
        jail.set_env("VQ_QUEUE__RECORD_TTL_DAYS", "2");
        assert_eq!(Settings::load(None, &Overrides::default()).unwrap().limits().record_ttl_s, 2 * 86_400);
        jail.set_env("VQ_QUEUE__RECORD_TTL_DAYS", "0");
        let err = Settings::load(None, &Overrides::default()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "queue.record_ttl_days (VQ_QUEUE__RECORD_TTL_DAYS) must be between 1 and 3650, got 0"
        );
        Ok(())
    });
}

#[test]
fn a_value_that_parses_but_breaks_a_rule_says_which() {
    Jail::expect_with(|jail| {
        let load = || Settings::load(None, &Overrides::default()).unwrap_err();
        jail.set_env("VQ_QUEUE__KEY_TTL_S", "60");
        jail.set_env("VQ_QUEUE__HEARTBEAT_TIMEOUT_S", "60");
        let err = load();
        assert!(matches!(err, ConfigError::Invalid(SettingError::KeyTtlNotAboveHeartbeat { .. })), "{err:?}");
        assert_eq!(err.to_string(), "queue.key_ttl_s (60) must be longer than queue.heartbeat_timeout_s (60)");
        jail.set_env("VQ_QUEUE__KEY_TTL_S", "10");
        let err = load();
        let range = SettingError::OutOfRange { key: "queue.key_ttl_s", min: 60, max: 604_800, value: 10 };
        assert!(matches!(&err, ConfigError::Invalid(e) if *e == range), "{err:?}");
        assert_eq!(err.to_string(), "queue.key_ttl_s (VQ_QUEUE__KEY_TTL_S) must be between 60 and 604800, got 10");
        jail.set_env("VQ_QUEUE__KEY_TTL_S", "120");
        jail.set_env("VQ_GATE__UPSTREAM", "https://shop");
        assert!(matches!(load(), ConfigError::Invalid(SettingError::UpstreamNotHttp(_))));
        jail.set_env("VQ_GATE__UPSTREAM", "http://127.0.0.1:9000");
        for bad in ["", "Sold Out", "x-queue-close:", "\u{e9}t\u{e9}"] {
            jail.set_env("VQ_GATE__CLOSE_HEADER", bad);
            let err = load();
            let named = SettingError::CloseHeaderNotAName(bad.into());
            assert!(matches!(&err, ConfigError::Invalid(e) if *e == named), "{bad:?}: {err:?}");
            assert!(err.to_string().contains("gate.close_header (VQ_GATE__CLOSE_HEADER)"), "{err}");
        }
        jail.set_env("VQ_GATE__CLOSE_HEADER", "X-Sold-Out");
        for bad in ["", "shop internal", "user@shop", "shop/x", "shop:port"] {
            jail.set_env("VQ_GATE__UPSTREAM_HOST", bad);
            let named = SettingError::UpstreamHostNotAHost(bad.into());
            assert!(matches!(&load(), ConfigError::Invalid(e) if *e == named), "{bad:?}");
        }
        for good in ["shop.internal", "shop.internal:8443", "[::1]:9000"] {
            jail.set_env("VQ_GATE__UPSTREAM_HOST", good);
            assert_eq!(Settings::load(None, &Overrides::default()).unwrap().gate.upstream_host.as_deref(), Some(good));
        }
        assert_eq!(Settings::load(None, &Overrides::default()).unwrap().gate.close_header, "X-Sold-Out");
        let missing = Settings::load(Some(Path::new("nope.toml")), &Overrides::default()).unwrap_err();
        assert_eq!(missing.to_string(), "config file nope.toml does not exist");
        Ok(())
    });
}

#[test]
fn unknown_keys_are_errors_naming_the_key() {
    Jail::expect_with(|jail| {
        jail.create_file("vq.toml", "[queue]\nbatch_sise = 5\n")?;
        let err = Settings::load(Some(Path::new("vq.toml")), &Overrides::default()).unwrap_err();
        assert!(err.to_string().contains("batch_sise"), "{err}");
        Ok(())
    });
    Jail::expect_with(|jail| {
        jail.set_env("VQ_QUEUE__TICKMS", "5");
        let err = Settings::load(None, &Overrides::default()).unwrap_err();
        assert!(err.to_string().contains("tickms"), "{err}");
        Ok(())
    });
}

#[test]
fn webhooks_are_checked_at_load_naming_the_key() {
    Jail::expect_with(|jail| {
        jail.create_file(
            "vq.toml",
            "[events]\nwebhook_urls = [\"http://127.0.0.1:9000/a\"]\n\n[[events.webhooks]]\nname = \"orders\"\nurl = \"http://crm.internal/hooks\"\nsecret_env = \"ORDERS_SECRET\"\n",
        )?;
        // VQ_EVENTS_SECRET is a secret, not a configuration key.
        jail.set_env("VQ_EVENTS_SECRET", "not-a-key");
        let s = Settings::load(Some(Path::new("vq.toml")), &Overrides::default()).unwrap();
        let all = s.events.all_webhooks();
        assert_eq!(
            all.iter().map(|w| (w.name.as_str(), w.secret_env())).collect::<Vec<_>>(),
            [("orders", "ORDERS_SECRET"), ("http://127.0.0.1:9000/a", "VQ_EVENTS_SECRET")]
        );
        for (file, says) in [
            ("[[events.webhooks]]\nname = \"a b\"\nurl = \"http://x/\"\n", "the name `a b` must be"),
            (
                "[[events.webhooks]]\nname = \"a\"\nurl = \"https://x/\"\n",
                "events.webhooks.a.url must be an http:// URL",
            ),
            ("[[events.webhooks]]\nname = \"a\"\nurl = \"ftp://x/\"\n", "events.webhooks.a.url must be an http:// URL"),
            (
                "[[events.webhooks]]\nname = \"a\"\nurl = \"http://x/\"\nsecret_env = \"VQ_A\"\n",
                "`VQ_A` starts with VQ_",
            ),
            (
                "[[events.webhooks]]\nname = \"a\"\nurl = \"http://x/\"\n[[events.webhooks]]\nname = \"a\"\nurl = \"http://y/\"\n",
                "`a` names two webhooks",
            ),
            ("[events]\nwebhook_urls = [\"http:///nohost\"]\n", "events.webhook_urls[0]"),
            ("[events]\nmax_len = 5\n", "events.max_len (VQ_EVENTS__MAX_LEN) must be between 10"),
            ("[events]\nretry_min_ms = 1000\nretry_max_ms = 500\n", "events.retry_max_ms (500) must be at least"),
            ("[events]\nwebhook = []\n", "unknown field"),
        ] {
            jail.create_file("vq.toml", file)?;
            let err = Settings::load(Some(Path::new("vq.toml")), &Overrides::default()).unwrap_err().to_string();
            assert!(err.contains(says), "{file}: {err}");
        }
        Ok(())
    });
}

#[test]
fn lanes_are_read_per_type_and_checked() {
    let types = "[[targets.types]]\nslug = \"ticketing-event\"\n[[targets.types]]\nslug = \"limited-drop\"\n";
    Jail::expect_with(|jail| {
        jail.create_file(
            "vq.toml",
            &format!(
                "{types}lane_secret_env = \"SHOP_LANE_KEY\"\n[[targets.types.lanes]]\nname = \"members\"\nshare = 70\nopens_before_s = 3600\n"
            ),
        )?;
        jail.set_env("SHOP_LANE_KEY", "k");
        let s = Settings::load(Some(Path::new("vq.toml")), &Overrides::default()).unwrap();
        let kind = crate::domain::QueueTargetType::LIMITED_DROP;
        let lanes = s.type_lanes(kind);
        assert_eq!(lanes.len(), 1);
        assert_eq!((lanes[0].name.as_str(), lanes[0].share, lanes[0].opens_before_s), ("members", 70, 3600));
        assert_eq!(s.type_lane_secret(kind), Some(b"k".to_vec()));
        assert!(s.type_lanes(crate::domain::QueueTargetType::TICKETING_EVENT).is_empty());
        assert_eq!(s.limits().lanes(kind), lanes.as_slice());
        Ok(())
    });
    for (lanes, says) in [
        ("name = \"Members\"\nshare = 10\n", "not a lane name"),
        ("name = \"members\"\nshare = 0\n", "between 1 and 99"),
        ("name = \"a\"\nshare = 60\n[[targets.types.lanes]]\nname = \"b\"\nshare = 40\n", "add up to 100"),
        ("name = \"a\"\nshare = 10\n[[targets.types.lanes]]\nname = \"a\"\nshare = 10\n", "named twice"),
    ] {
        Jail::expect_with(|jail| {
            jail.create_file("vq.toml", &format!("{types}[[targets.types.lanes]]\n{lanes}"))?;
            let e = Settings::load(Some(Path::new("vq.toml")), &Overrides::default()).unwrap_err().to_string();
            assert!(e.contains("targets.types.limited-drop.lanes") && e.contains(says), "{lanes}: {e}");
            Ok(())
        });
    }
}
