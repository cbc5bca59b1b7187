//! Promise pipelining: start -> write -> closeStdin -> read until closed,
//! one call after another and all at once, behind proxies that delay every
//! message by 25 ms each way: against one server, and through a chain
//! A -> B with a delaying proxy on each link. The proxies count round
//! trips causally (see `tests/common/proxy.rs`).

#[path = "../../examples/support/pipelining_flows.rs"]
mod flows;
#[path = "../../tests/common/proxy.rs"]
mod proxy;

use std::error::Error;
use std::time::{Duration, Instant};

use capexec::capexec_capnp::executor;

use crate::Plan;
use crate::report::Report;
use crate::servers::Serve;
use proxy::Proxy;

const SECTION: &str = "pipelining";
const DELAY: Duration = Duration::from_millis(25);

pub async fn run(plan: &Plan, report: &mut Report) -> Result<(), Box<dyn Error>> {
    eprintln!(
        "pipelining: {} round(s), {} ms each way",
        plan.pipelining_rounds,
        DELAY.as_millis()
    );
    let dir = tempfile::tempdir()?;
    for link in ["a", "b", "single"] {
        std::fs::create_dir_all(dir.path().join(link))?;
    }
    let far = Serve::start(false, &[])?;
    let far_link = Proxy::in_front_of(&far.address, &dir.path().join("b"), DELAY).await?;
    let front = Serve::start(
        false,
        &[
            "--upstream".to_string(),
            format!("b={}", far_link.address()),
            "--default".to_string(),
            "b".to_string(),
        ],
    )?;
    let front_link = Proxy::in_front_of(&front.address, &dir.path().join("a"), DELAY).await?;
    let single_link = Proxy::in_front_of(&far.address, &dir.path().join("single"), DELAY).await?;

    let single = capexec::net::connect(single_link.address(), None).await?;
    let chained = capexec::net::connect(front_link.address(), None).await?;
    let setups: [(&str, executor::Client, Vec<&Proxy>); 2] = [
        ("one server", single.executor(), vec![&single_link]),
        (
            "chain A -> B",
            chained.executor(),
            vec![&front_link, &far_link],
        ),
    ];
    for (name, executor, links) in &setups {
        // Warm up: the bootstrap, and the chain's upstream connection.
        flows::pipelined(executor, b"warm\n").await?;
        let (mut one_trip, mut sequential, mut pipelined) = (Vec::new(), Vec::new(), Vec::new());
        let (mut sequential_flights, mut pipelined_flights) = (Vec::new(), Vec::new());
        for _ in 0..plan.pipelining_rounds {
            let started = Instant::now();
            executor.info_request().send().promise.await?;
            one_trip.push(started.elapsed());

            reset(links);
            let started = Instant::now();
            expect(flows::sequential(executor, b"line\n").await?)?;
            sequential.push(started.elapsed());
            sequential_flights.push(flights(links));

            reset(links);
            let started = Instant::now();
            expect(flows::pipelined(executor, b"line\n").await?)?;
            pipelined.push(started.elapsed());
            pipelined_flights.push(flights(links));
        }
        let baseline = report.baseline(
            SECTION,
            format!("{name}: one call (`info`)"),
            one_trip,
            None,
        );
        let shown = |all: &[Vec<u64>]| format!("round trips per link: {}", distinct(all));
        report.case(
            SECTION,
            format!("{name}: sequential"),
            sequential,
            baseline,
            None,
            None,
            shown(&sequential_flights),
        );
        report.case(
            SECTION,
            format!("{name}: pipelined"),
            pipelined,
            baseline,
            None,
            None,
            shown(&pipelined_flights),
        );
        let one_per_hop = pipelined_flights
            .iter()
            .all(|per_link| per_link.iter().all(|&f| f == 1));
        report.figure(
            SECTION,
            format!("{name}: pipelined round trips per link, every round"),
            distinct(&pipelined_flights),
            Some(("1 per hop".to_string(), one_per_hop)),
        );
    }
    Ok(())
}

fn reset(links: &[&Proxy]) {
    for link in links {
        link.reset();
    }
}

fn flights(links: &[&Proxy]) -> Vec<u64> {
    links.iter().map(|link| link.flights()).collect()
}

fn expect(output: String) -> Result<(), Box<dyn Error>> {
    if output == "line\n" {
        Ok(())
    } else {
        Err(format!("cat answered {output:?}").into())
    }
}

/// Every different per-link count seen over the rounds, e.g. `[[1, 1]]`.
fn distinct(all: &[Vec<u64>]) -> String {
    let mut seen: Vec<&Vec<u64>> = Vec::new();
    for counts in all {
        if !seen.contains(&counts) {
            seen.push(counts);
        }
    }
    format!("{seen:?}")
}
