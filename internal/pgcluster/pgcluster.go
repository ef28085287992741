// Package pgcluster runs a private, throwaway Postgres cluster for tests that
// must stop and restart the server (initdb + pg_ctl from the host). As root
// it runs the cluster as the postgres user, since Postgres refuses to run as
// root.
package pgcluster

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// Cluster is a private Postgres server on 127.0.0.1.
type Cluster struct {
	dir    string
	port   int
	initdb string
	pgCtl  string
	asUser string // run server commands as this user ("" = the current one)
}

// New creates and starts a cluster; it is stopped and removed when tb ends.
// The test is skipped when the host has no Postgres server binaries.
func New(tb testing.TB) *Cluster {
	tb.Helper()
	initdb, err1 := findBin("initdb")
	pgCtl, err2 := findBin("pg_ctl")
	if err1 != nil || err2 != nil {
		tb.Skip("no Postgres server binaries (initdb, pg_ctl) on this host")
	}
	c := &Cluster{initdb: initdb, pgCtl: pgCtl}
	if os.Geteuid() == 0 {
		if _, err := user.Lookup("postgres"); err != nil {
			tb.Skip("running as root without a postgres user to run a private cluster as")
		}
		c.asUser = "postgres"
	}
	dir, err := os.MkdirTemp("", "sluice-pgcluster-")
	if err != nil {
		tb.Fatal(err)
	}
	c.dir = dir
	tb.Cleanup(func() {
		_ = c.run("stop", "-m", "immediate")
		_ = os.RemoveAll(dir)
	})
	if c.asUser != "" {
		if err := exec.Command("chown", c.asUser, dir).Run(); err != nil {
			tb.Fatalf("chown cluster dir: %v", err)
		}
	}
	if out, err := c.command(c.initdb, "-D", c.dataDir(), "-U", "postgres", "--auth=trust", "--encoding=UTF8", "--no-sync").CombinedOutput(); err != nil {
		tb.Fatalf("initdb: %v\n%s", err, out)
	}
	c.port = freePort(tb)
	if err := c.Start(); err != nil {
		tb.Fatal(err)
	}
	return c
}

// URL is the connection string of database name on the cluster.
func (c *Cluster) URL(name string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", c.port, name)
}

// Start starts the server (after Stop).
func (c *Cluster) Start() error {
	return c.run("start", "-w", "-t", "60", "-l", filepath.Join(c.dir, "server.log"),
		"-o", fmt.Sprintf("-c listen_addresses=127.0.0.1 -p %d -c unix_socket_directories='' -c fsync=off -c max_connections=200", c.port))
}

// Stop stops the server: mode is "fast" (clean) or "immediate" (crash).
func (c *Cluster) Stop(mode string) error {
	return c.run("stop", "-w", "-m", mode)
}

// Log is the server's log.
func (c *Cluster) Log() string {
	b, _ := os.ReadFile(filepath.Join(c.dir, "server.log"))
	return string(b)
}

func (c *Cluster) dataDir() string { return filepath.Join(c.dir, "data") }

func (c *Cluster) run(args ...string) error {
	args = append([]string{"-D", c.dataDir()}, args...)
	out, err := c.command(c.pgCtl, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("pg_ctl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

func (c *Cluster) command(bin string, args ...string) *exec.Cmd {
	if c.asUser == "" {
		return exec.Command(bin, args...)
	}
	if _, err := exec.LookPath("runuser"); err == nil {
		return exec.Command("runuser", append([]string{"-u", c.asUser, "--", bin}, args...)...)
	}
	quoted := make([]string, 0, len(args)+1)
	for _, a := range append([]string{bin}, args...) {
		quoted = append(quoted, "'"+strings.ReplaceAll(a, "'", `'\''`)+"'")
	}
	return exec.Command("su", c.asUser, "-s", "/bin/sh", "-c", strings.Join(quoted, " "))
}

func findBin(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/" + name)
	if len(matches) > 0 {
		return matches[len(matches)-1], nil
	}
	return "", fmt.Errorf("%s not found", name)
}

func freePort(tb testing.TB) int {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer l.Close()
	_, port, _ := net.SplitHostPort(l.Addr().String())
	n, _ := strconv.Atoi(port)
	return n
}
