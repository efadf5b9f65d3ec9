# pdd-testbed — the two commands: `make setup`, then `make test`.
VENV   := .venv
PY     := $(VENV)/bin/python
BIN    := $(VENV)/bin

.PHONY: setup test test-fast lint format bench bench-net bench-transfer bench-handoff bench-faults bench-workers soak \
        bench-wan-sweep bench-paper bench-hetero bench-bathtub bench-mooncake plan clean help

help:            ## list targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | sed 's/:.*##/\t/'

setup:           ## install Debian packages, the venv, CPU torch, SGLang and the project
	bash scripts/setup.sh

test:            ## run every test (real SGLang, real namespaces; needs root)
	$(BIN)/pytest

test-fast:       ## tests that start no SGLang server
	$(BIN)/pytest -m "not sglang"

lint:            ## ruff lint and format check
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

format:          ## ruff format and autofix
	$(BIN)/ruff format . && $(BIN)/ruff check --fix .

SCENARIO ?= default
bench:           ## every system of a scenario (SCENARIO=default) on one network and trace; HTML report
	$(BIN)/testbed bench $(SCENARIO)

clean:           ## remove run outputs (keeps the venv)
	rm -rf runs .pytest_cache

bench-net:       ## link fidelity, configured vs measured, over rates x delays x losses (CSV)
	$(BIN)/testbed net bench

bench-transfer:  ## KV goodput over the emulated WAN (1-64 MB) and the baselines' TTFT
	$(BIN)/testbed bench-transfer

bench-handoff:   ## 100-token handoff over a lossy WAN: KV shipped vs token ids + recompute
	$(BIN)/testbed bench-handoff handoff

bench-peers:     ## SGLang's bench_serving against same_site_pd, cross_site_pd, pdd: ITL and TTFT as its client sees them
	$(BIN)/testbed bench-peers default

bench-faults:    ## fault matrix on pdd and the baselines: cuts, loss, rate dips, kill -9 (~25 min)
	$(BIN)/testbed bench-faults faults

bench-workers:   ## default's pdd with Locust as a master and 1, then 2 workers: load CPU per request, harness share of TTFT
	$(BIN)/testbed bench default --set 'systems=[pdd]' --set 'sweep={workload.workers: [1, 2]}'

soak:            ## 30 min of pdd at 1% WAN loss, 5 ms jitter: failures, every process's RSS growth
	$(BIN)/testbed soak soak

bench-wan-sweep: ## same_site_pd, cross_site_pd and pdd over WAN rate x loss; sweep.html
	$(BIN)/testbed bench wan_sweep

bench-paper:     ## PDD.md's scale on GPU hosts (set model.path in scenarios/paper.yaml)
	$(BIN)/testbed bench paper

bench-hetero:    ## GPU-A/GPU-B chips emulated (paced, time-dilated): BCR, pacing, planner table
	$(BIN)/testbed bench hetero

bench-bathtub:   ## throughput and benefit against the prefix-hit ratio; sweep.html with the bathtub
	$(BIN)/testbed bench bathtub

bench-mooncake:  ## real low-hit traffic (Mooncake FAST'25, scaled) on every system
	$(BIN)/testbed bench mooncake_lowhit

plan:            ## size every design for the hetero scenario's trace; print the BCR table
	$(BIN)/testbed plan hetero
