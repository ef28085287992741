# sluice — `make help` lists the targets.
#
# run and test use DATABASE_URL / TEST_DATABASE_URL when set; else a server on
# 127.0.0.1:5432; else a private throwaway cluster under .dev/ (scripts/pg.sh).

SHELL        := /bin/bash
.SHELLFLAGS  := -eu -o pipefail -c
.DEFAULT_GOAL := help

GO       ?= go
BIN      := bin/sluice
PG       := scripts/pg.sh
# Extra flags for go test, e.g. make test TESTFLAGS='-run TestWorker -v'.
TESTFLAGS ?=

.PHONY: help build run test torture torture-corpus torture-mutants e2e soak promtool chromium browser-test screenshots generate check bench clean dev-db-start dev-db-stop

help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-z][a-z0-9_-]*:.*## / {printf "  %-16s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

build: ## build bin/sluice
	$(GO) build -o $(BIN) ./cmd/sluice

run: build ## migrate the database and start a worker (DATABASE_URL, its database created if missing; else 127.0.0.1:5432/sluice, else .dev/)
	@$(PG) with-database sluice bash -c 'echo "make run: database $$(echo "$$DATABASE_URL" | sed -E "s#(://[^:/@]*:)[^@/]*@#\1xxxxx@#")"; \
		echo "make run: the other commands need it too: export DATABASE_URL=\"\$$(scripts/pg.sh database-url sluice)\""; \
		./$(BIN) migrate up && exec ./$(BIN) worker'

# The 30-second torture run goes after the suite, alone, so that the other
# packages' tests do not share its two cores; TESTFLAGS (a narrowed run)
# leaves it out.
test: ## run the whole test suite against real Postgres (TEST_DATABASE_URL, else 127.0.0.1:5432, else .dev/), then 30 s of the torture test against real workers (not with TESTFLAGS)
	@$(PG) with-server $(GO) test -count=1 $(TESTFLAGS) ./...
	@$(if $(TESTFLAGS),true,$(PG) with-server env TORTURE=1 TORTURE_DURATION=30s $(GO) test -count=1 -timeout 10m -run '^TestTorture$$' ./limiter/torture/)

# TORTURE_DURATION (a Go duration) sets the budget; TORTURE_SEED=N replays one
# seed, alone (no scenarios); TORTURE_WORKER_LOGS=DIR keeps each worker
# process's log there; TORTURE_FAILED_LOGS=DIR has the workers trace the
# limiter and keeps the logs of the seeds that fail only.
torture: ## run the limiter's torture test: its scenarios, then seeded random schedules against real workers for TORTURE_DURATION (default 10m), every promise checked, with the coverage table
	@$(PG) with-server env TORTURE=1 TORTURE_DURATION=$${TORTURE_DURATION:-10m} $(GO) test -count=1 -timeout 0 -v -run '$(if $(TORTURE_SEED),^TestTorture$$,^TestTorture)' ./limiter/torture/

torture-corpus: ## run every seed of the torture test that ever caught a bug (limiter/torture/corpus_test.go)
	@$(PG) with-server env TORTURE_CORPUS=1 $(GO) test -count=1 -timeout 0 -v -run '^TestTortureCorpus$$' ./limiter/torture/

# MUTANT_DURATION (a Go duration, default 90s) is each mutant's torture run;
# name mutants to run only those: make torture-mutants MUTANTS='a b';
# MUTANT_LOGS=DIR keeps each mutant's torture log.
torture-mutants: ## the torture test's mutation suite: each patch in limiter/torture/mutants/ breaks a promise on a copy of HEAD, and the torture test must catch it
	@$(PG) with-server env GO=$(GO) scripts/torture-mutants.sh $${MUTANTS:-}

e2e: ## the fault and load suite (e2e/) alone, with the full 100,000-job load
	@$(PG) with-server env SLUICE_E2E_LOAD_JOBS=full $(GO) test -count=1 -timeout 30m -v $(TESTFLAGS) ./e2e/

# SOAK_DURATION (a Go duration, at least 1m) shortens or lengthens it.
soak: ## keep a worker busy with 5,000 no-op jobs/s for SOAK_DURATION (default 5m) and fail if its memory grows (TestSoak)
	@$(PG) with-server env SLUICE_SOAK=1 SOAK_DURATION=$${SOAK_DURATION:-5m} $(GO) test -count=1 -timeout 60m -v -run '^TestSoak$$' ./e2e/

promtool: ## install promtool if missing (Debian's prometheus package) and check the alerting rules and a live /metrics with it
	@if ! command -v promtool >/dev/null; then \
	  sudo=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  $$sudo apt-get update && $$sudo apt-get install -y --no-install-recommends prometheus; fi
	@$(PG) with-server $(GO) test -count=1 -v -run 'TestAlertRules|TestLiveScrapePassesPromtool' ./app/

# Debian's chromium package (with its recommended fonts, which screenshots
# need); sudo only when not root. $SLUICE_CHROMIUM names another binary.
chromium: ## install Chromium if missing (Debian's chromium package), for browser-test and screenshots
	@if [ -z "$${SLUICE_CHROMIUM:-}" ] && ! command -v chromium >/dev/null && ! command -v chromium-browser >/dev/null \
	  && ! command -v google-chrome >/dev/null; then \
	  sudo=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  $$sudo apt-get update && $$sudo apt-get install -y chromium; fi

browser-test: chromium ## install Chromium if missing and open the web pages and River UI in it, headless (TestBrowserPages)
	@$(PG) with-server env SLUICE_BROWSER_TEST=required $(GO) test -count=1 -v -run 'TestBrowserPages' ./app/

screenshots: chromium ## retake the PNGs of the web pages in docs/screenshots/ with the browser test
	@$(PG) with-server env SLUICE_BROWSER_TEST=required SLUICE_SCREENSHOTS=$(CURDIR)/docs/screenshots $(GO) test -count=1 -run 'TestBrowserPages' ./app/

generate: ## regenerate db/ from queries/ and migrations/ with sqlc (and River's schema for sqlc)
	$(GO) run ./internal/cmd/riverschema db/schema/river.sql
	$(GO) tool sqlc generate

check: ## gofmt, go vet, generated code up to date, and the torture mutants still apply
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './.dev/*')); \
	  if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	@tmp=$$(mktemp); $(GO) run ./internal/cmd/riverschema $$tmp; \
	  if ! cmp -s $$tmp db/schema/river.sql; then rm -f $$tmp; echo "db/schema/river.sql is stale: run make generate"; exit 1; fi; rm -f $$tmp
	@$(GO) tool sqlc diff || { echo "db/ is stale: run make generate"; exit 1; }
	@if git rev-parse --git-dir >/dev/null 2>&1; then for p in limiter/torture/mutants/*.patch; do \
	  git apply --check "$$p" || { echo "$$p no longer applies: make it again on today's code"; exit 1; }; done; fi
	@echo "check: ok"

# One package at a time (-p 1), so that benchmarks do not compete for the CPUs.
bench: ## run every benchmark once and print one table (figure, comparison, ratio, target)
	@$(PG) with-server bash -o pipefail -c "$(GO) test -run '^\$$' -bench . -benchtime 1x -count 1 -p 1 -timeout 90m -json ./... | $(GO) run ./internal/cmd/benchreport"

dev-db-start: ## start the private cluster under .dev/ (prints its URL)
	@$(PG) start

dev-db-stop: ## stop the private cluster under .dev/
	@$(PG) stop

clean: ## stop the private cluster and remove bin/ and .dev/
	@$(PG) stop || true
	rm -rf bin .dev
