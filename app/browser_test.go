package app_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/fetch"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/app"
)

// chromium finds a Chromium (or Chrome) binary: $SLUICE_CHROMIUM, else the
// usual names on $PATH; "" when there is none.
func chromium() string {
	if path := os.Getenv("SLUICE_CHROMIUM"); path != "" {
		return path
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if path, err := exec.LookPath(name); err == nil {
			return path
		}
	}
	return ""
}

// rowsScript returns the text of every table row's cells, spaces
// collapsed, as htmlRows does for plain HTTP.
const rowsScript = `Array.from(document.querySelectorAll("tr")).map(r => Array.from(r.cells).map(c => c.innerText.trim().split(/\s+/).filter(Boolean).join(" ")))`

// TestBrowserPages opens sluice's pages and River UI in a real headless
// Chromium, as an operator would: the worker listens under a prefix with a
// token, the browser answers the basic-auth challenge with it, and the
// pages must show the fixture's data in the DOM; a job's link leads to its
// page in River UI, which loads and reads River's jobs through its API.
// With $SLUICE_SCREENSHOTS set to a directory, it saves a PNG of each page
// there (make screenshots). Skipped without Chromium (make browser-test
// installs it, and sets $SLUICE_BROWSER_TEST=required so that it fails
// instead).
func TestBrowserPages(t *testing.T) {
	path := chromium()
	if path == "" && os.Getenv("SLUICE_BROWSER_TEST") == "required" {
		t.Fatal("no Chromium found (chromium, chromium-browser, google-chrome, or $SLUICE_CHROMIUM)")
	}
	if path == "" {
		t.Skip("no Chromium found (chromium, chromium-browser, google-chrome, or $SLUICE_CHROMIUM): the pages are checked over plain HTTP only (TestWebPages); `make browser-test` installs Chromium and runs this test")
	}
	shots := os.Getenv("SLUICE_SCREENSHOTS")

	const token = "browser-test-token-0123456789"
	f := startOpsWorker(t, app.Config{HTTPToken: token, HTTPPrefix: "/ops"})
	base := "http://" + f.w.HTTPAddr() + "/ops"

	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.WindowSize(1440, 800),
		// Our own pages on loopback, in a container that may not allow
		// Chromium's sandbox (as root it refuses to start with it).
		chromedp.NoSandbox,
		chromedp.Flag("disable-dev-shm-usage", true),
	)...)
	defer cancelAlloc()
	ctx, cancel := chromedp.NewContext(allocCtx)
	defer cancel()

	// Answer every basic-auth challenge with the token, as an operator
	// would in the browser's prompt, and count the challenges.
	var challenges atomic.Int32
	require.NoError(t, chromedp.Do(ctx, chromedp.Func(func(_ context.Context, target *chromedp.Target) error {
		go func() {
			for ev, err := range cdp.Events(ctx, target, fetch.RequestPaused) {
				if err != nil {
					return
				}
				_, _ = cdp.Call(ctx, target, fetch.ContinueRequest, fetch.ContinueRequestParams{RequestID: ev.RequestID})
			}
		}()
		go func() {
			for ev, err := range cdp.Events(ctx, target, fetch.AuthRequired) {
				if err != nil {
					return
				}
				if ev.AuthChallenge != nil && ev.AuthChallenge.Scheme == "basic" && ev.AuthChallenge.Realm == "sluice" {
					challenges.Add(1)
				}
				_, _ = cdp.Call(ctx, target, fetch.ContinueWithAuth, fetch.ContinueWithAuthParams{
					RequestID: ev.RequestID,
					AuthChallengeResponse: &fetch.AuthChallengeResponse{
						Response: fetch.AuthChallengeResponseResponseProvideCredentials, Username: "ops", Password: token,
					},
				})
			}
		}()
		handleAuth := true
		_, err := cdp.Call(ctx, target, fetch.Enable, fetch.EnableParams{HandleAuthRequests: &handleAuth})
		return err
	})))

	shoot := func(name string) {
		if shots == "" {
			return
		}
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		require.NoError(t, err)
		require.NoError(t, os.MkdirAll(shots, 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(shots, name+".png"), png, 0o644))
	}
	open := func(t *testing.T, url string) {
		t.Helper()
		require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(url), chromedp.WaitReady(chromedp.CSS("footer"))))
	}

	open(t, base+"/ui/")
	require.Positive(t, challenges.Load(), "the browser was asked for the token")
	title, err := chromedp.Run(ctx, chromedp.Title())
	require.NoError(t, err)
	require.Equal(t, "Operations · sluice", title)
	shoot("index")

	checkPages(t, f, func(t *testing.T, page string) [][]string {
		open(t, base+"/ui/"+page)
		rows, err := chromedp.Run(ctx, chromedp.Evaluate[[][]string](rowsScript))
		require.NoError(t, err)
		shoot(page)
		return rows
	})

	// A parked job's link leads to its page in River UI, which reads it
	// through its API (River's schema).
	parked := f.parked[0]
	open(t, base+"/ui/limits")
	require.NoError(t, chromedp.Do(ctx, chromedp.Click(chromedp.CSS(fmt.Sprintf(`a[href="../riverui/jobs/%d"]`, parked)))))
	waitText(t, ctx, "demo.sleep")
	location, err := chromedp.Run(ctx, chromedp.Location())
	require.NoError(t, err)
	require.Equal(t, fmt.Sprintf("%s/riverui/jobs/%d", base, parked), location)

	// River UI's job list shows the parked jobs as pending.
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(base+"/riverui/jobs?state=pending")))
	waitText(t, ctx, "demo.sleep")
	shoot("riverui")
}

// waitText waits until the page's text contains s (River UI renders after
// its API answers; a click may still be navigating).
func waitText(t *testing.T, ctx context.Context, s string) {
	t.Helper()
	var text string
	ok := assert.Eventually(t, func() bool {
		var err error
		text, err = chromedp.Run(ctx, chromedp.Evaluate[string]("document.body ? document.body.innerText : ''"))
		return err == nil && strings.Contains(text, s)
	}, 30*time.Second, 50*time.Millisecond)
	require.True(t, ok, "waiting for %q; the page says: %s", s, strings.TrimSpace(text))
}
