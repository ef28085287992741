// Command benchreport turns the output of `go test -bench` into the one
// table `make bench` prints: a row per benchmark with its figure, the
// comparison measured beside it in the same run, the ratio, the target and
// whether the target is met.
//
//	go test -run '^$' -bench . -benchtime 1x -json ./... | benchreport [-database-url URL]
//
// It reads go test's JSON (-json, which also carries the reason a benchmark
// was skipped) or plain output from stdin, echoes the plain output as it
// comes, and prints the machine (CPUs, memory, CPU model, Postgres version
// when -database-url or TEST_DATABASE_URL names a server) and the table at
// the end. It exits 1 when a package failed.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

func main() {
	dbURL := flag.String("database-url", os.Getenv("TEST_DATABASE_URL"), "Postgres server whose version to report (default $TEST_DATABASE_URL)")
	flag.Parse()
	if flag.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "usage: go test -bench . -json ./... | benchreport [-database-url URL]")
		os.Exit(2)
	}
	run, err := Parse(os.Stdin, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchreport:", err)
		os.Exit(1)
	}
	fmt.Println()
	writeMachine(os.Stdout, run, *dbURL)
	fmt.Println()
	WriteTable(os.Stdout, Rows(run.Results))
	if len(run.FailedPackages) > 0 {
		fmt.Fprintf(os.Stderr, "benchreport: failed: %s\n", strings.Join(run.FailedPackages, ", "))
		os.Exit(1)
	}
}

// writeMachine describes where the figures were measured.
func writeMachine(w io.Writer, run *Run, dbURL string) {
	cpu := run.CPU
	if cpu == "" {
		cpu = procValue("/proc/cpuinfo", "model name")
	}
	fmt.Fprintf(w, "Measured %s UTC: %d CPUs (%s), %s memory, %s, Postgres %s.\n",
		time.Now().UTC().Format("2006-01-02 15:04"), runtime.NumCPU(), orDefault(cpu, "unknown CPU"),
		memory(), runtime.Version(), postgresVersion(dbURL))
}

// memory is MemTotal of /proc/meminfo in GiB.
func memory() string {
	v := strings.Fields(procValue("/proc/meminfo", "MemTotal"))
	if len(v) == 0 {
		return "unknown"
	}
	kb, err := strconv.ParseFloat(v[0], 64)
	if err != nil {
		return "unknown"
	}
	return fmt.Sprintf("%.1f GiB", kb/1024/1024)
}

// procValue returns the value of the first "key: value" line of a /proc
// file.
func procValue(path, key string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == key {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// postgresVersion asks the server at url for its version.
func postgresVersion(url string) string {
	if url == "" {
		return "(version unknown: no database URL)"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return "(version unknown: server unreachable)"
	}
	defer conn.Close(ctx)
	var v string
	if err := conn.QueryRow(ctx, "SHOW server_version").Scan(&v); err != nil {
		return "(version unknown)"
	}
	return v
}
