// Package proc runs the real sluice binary for tests: it builds bin/sluice
// once per test process, runs CLI commands, and starts, signals and kills
// worker processes.
package proc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var (
	buildOnce sync.Once
	buildErr  error
	binPath   string
)

// Binary builds the sluice binary (once per test process) into a temporary
// directory and returns its path.
func Binary(tb testing.TB) string {
	tb.Helper()
	buildOnce.Do(func() {
		_, file, _, _ := runtime.Caller(0)
		root := filepath.Join(filepath.Dir(file), "..", "..")
		dir, err := os.MkdirTemp("", "sluice-e2e-bin-")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "sluice")
		cmd := exec.Command("go", "build", "-o", binPath, "./cmd/sluice")
		cmd.Dir = root
		out, err := cmd.CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		tb.Fatalf("build sluice: %v", buildErr)
	}
	return binPath
}

// Result is the outcome of a CLI command.
type Result struct {
	Code   int
	Stdout string
	Stderr string
}

// Run runs `sluice args...` with DATABASE_URL=url (empty: unset) and extra
// environment env, and returns its exit code and output.
func Run(tb testing.TB, url string, env []string, args ...string) Result {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, Binary(tb), args...)
	cmd.Env = append(os.Environ(), "DATABASE_URL="+url)
	cmd.Env = append(cmd.Env, env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	res := Result{Stdout: stdout.String(), Stderr: stderr.String()}
	var exitErr *exec.ExitError
	switch {
	case errors.As(err, &exitErr):
		res.Code = exitErr.ExitCode()
	case err != nil:
		tb.Fatalf("run sluice %v: %v", args, err)
	}
	return res
}

// Worker is a `sluice worker` process.
type Worker struct {
	// Addr is its HTTP address.
	Addr string
	// ID is its worker id.
	ID string

	cmd    *exec.Cmd
	mu     sync.Mutex
	stderr bytes.Buffer
	done   chan struct{}
	err    error
}

// StartWorker starts `sluice worker` with DATABASE_URL=url, a free HTTP
// address, the given id and extra args, and waits until it serves /healthz.
// It is killed when tb ends, and its log is printed if tb failed.
func StartWorker(tb testing.TB, url, id string, args ...string) *Worker {
	tb.Helper()
	return StartWorkerEnv(tb, url, id, nil, args...)
}

// StartWorkerEnv is StartWorker with the variables env (KEY=VALUE) added to
// the worker's environment.
func StartWorkerEnv(tb testing.TB, url, id string, env []string, args ...string) *Worker {
	tb.Helper()
	w := &Worker{Addr: FreeAddr(tb), ID: id, done: make(chan struct{})}
	w.cmd = exec.Command(Binary(tb), append([]string{"worker", "--id", id, "--http-addr", w.Addr}, args...)...)
	w.cmd.Env = append(append(os.Environ(), "DATABASE_URL="+url, "SLUICE_LOG_FORMAT=text"), env...)
	w.cmd.Stdout = &lockedWriter{w: &w.stderr, mu: &w.mu}
	w.cmd.Stderr = &lockedWriter{w: &w.stderr, mu: &w.mu}
	if err := w.cmd.Start(); err != nil {
		tb.Fatalf("start worker: %v", err)
	}
	go func() {
		w.err = w.cmd.Wait()
		close(w.done)
	}()
	tb.Cleanup(func() {
		_ = w.cmd.Process.Signal(syscall.SIGCONT)
		_ = w.cmd.Process.Kill()
		<-w.done
		if tb.Failed() {
			tb.Logf("worker %s log:\n%s", w.ID, w.Log())
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-w.done:
			tb.Fatalf("worker %s exited at start: %v\n%s", id, w.err, w.Log())
		default:
		}
		if w.Healthy() {
			return w
		}
		time.Sleep(20 * time.Millisecond)
	}
	tb.Fatalf("worker %s did not serve /healthz within 30s\n%s", id, w.Log())
	return nil
}

// PID is the worker's process id.
func (w *Worker) PID() int { return w.cmd.Process.Pid }

// Healthy reports whether /healthz answers 200.
func (w *Worker) Healthy() bool {
	client := http.Client{Timeout: 2 * time.Second}
	resp, err := client.Get("http://" + w.Addr + "/healthz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// Signal sends sig to the worker.
func (w *Worker) Signal(tb testing.TB, sig syscall.Signal) {
	tb.Helper()
	if err := w.cmd.Process.Signal(sig); err != nil {
		tb.Fatalf("signal worker %s: %v", w.ID, err)
	}
}

// Kill sends SIGKILL and waits for the process to end.
func (w *Worker) Kill(tb testing.TB) {
	tb.Helper()
	w.Signal(tb, syscall.SIGKILL)
	<-w.done
}

// Wait waits up to timeout for the process to exit and returns its exit
// code (-1 if it was killed by a signal).
func (w *Worker) Wait(tb testing.TB, timeout time.Duration) int {
	tb.Helper()
	select {
	case <-w.done:
	case <-time.After(timeout):
		tb.Fatalf("worker %s still running after %s\n%s", w.ID, timeout, w.Log())
	}
	return w.cmd.ProcessState.ExitCode()
}

// Exited reports whether the process has ended.
func (w *Worker) Exited() bool {
	select {
	case <-w.done:
		return true
	default:
		return false
	}
}

// Log is what the worker wrote so far.
func (w *Worker) Log() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.stderr.String()
}

// LogContains reports whether the worker's log contains s.
func (w *Worker) LogContains(s string) bool { return strings.Contains(w.Log(), s) }

// FreeAddr returns a free 127.0.0.1 TCP address.
func FreeAddr(tb testing.TB) string {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("free address: %v", err)
	}
	defer l.Close()
	return l.Addr().String()
}

type lockedWriter struct {
	w  *bytes.Buffer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
