package app_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/html"

	"github.com/sluice-dev/sluice/app"
	"github.com/sluice-dev/sluice/internal/jobtest"
	"github.com/sluice-dev/sluice/internal/testdb"
	"github.com/sluice-dev/sluice/internal/testlog"
	"github.com/sluice-dev/sluice/module"
	"github.com/sluice-dev/sluice/modules/demo"
	"github.com/sluice-dev/sluice/modules/taskcancel"
)

// httpGet fetches url with header (key, value pairs) and returns the status,
// the headers and the body.
func httpGet(t *testing.T, url string, header ...string) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	require.NoError(t, err)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, resp.Header, string(body)
}

// htmlRows returns the text of every table row's cells in doc.
func htmlRows(t *testing.T, doc string) [][]string {
	t.Helper()
	root, err := html.Parse(strings.NewReader(doc))
	require.NoError(t, err)
	var rows [][]string
	var walk func(n *html.Node)
	walk = func(n *html.Node) {
		if n.Type == html.ElementNode && n.Data == "tr" {
			var cells []string
			for c := n.FirstChild; c != nil; c = c.NextSibling {
				if c.Type == html.ElementNode && (c.Data == "td" || c.Data == "th") {
					cells = append(cells, strings.Join(strings.Fields(nodeText(c)), " "))
				}
			}
			rows = append(rows, cells)
			return
		}
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			walk(c)
		}
	}
	walk(root)
	return rows
}

func nodeText(n *html.Node) string {
	if n.Type == html.TextNode {
		return n.Data
	}
	var b strings.Builder
	for c := n.FirstChild; c != nil; c = c.NextSibling {
		b.WriteString(nodeText(c))
	}
	return b.String()
}

// TestWebPages: sluice's pages show what the database holds (schedules,
// limits and parked jobs, workers, maintenance runs, the cancellation
// monitor's counts), link jobs to River UI, and River UI itself serves its
// application and reads River's jobs.
func TestWebPages(t *testing.T) {
	t.Parallel()

	f := startOpsWorker(t, app.Config{})
	base := "http://" + f.w.HTTPAddr()

	checkPages(t, f, func(t *testing.T, page string) [][]string {
		code, header, body := httpGet(t, base+"/ui/"+page)
		require.Equal(t, http.StatusOK, code, body)
		require.Equal(t, "text/html; charset=utf-8", header.Get("Content-Type"))
		require.Contains(t, header.Get("Content-Security-Policy"), "default-src 'none'")
		require.NotContains(t, body, "<script", "the pages need no JavaScript")
		return htmlRows(t, body)
	})

	// Jobs link to their page in River UI, relative to the page.
	_, _, body := httpGet(t, base+"/ui/limits")
	for _, id := range f.parked {
		require.Contains(t, body, fmt.Sprintf(`<a href="../riverui/jobs/%d">#%d</a>`, id, id))
	}

	// The index links every page, River UI and the JSON endpoints.
	code, _, body := httpGet(t, base+"/ui/")
	require.Equal(t, http.StatusOK, code)
	for _, href := range []string{"schedules", "limits", "workers", "maintenance", "cancellations", "../riverui/", "../health", "../stats", "../metrics", "style.css"} {
		require.Contains(t, body, `href="`+href+`"`)
	}
	code, header, _ := httpGet(t, base+"/")
	require.Equal(t, http.StatusFound, code)
	require.Equal(t, "ui/", header.Get("Location"), "relative, so that it holds under a mount prefix")
	code, header, body = httpGet(t, base+"/ui/style.css")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "text/css; charset=utf-8", header.Get("Content-Type"))
	require.Contains(t, body, "td.bad")
	code, _, _ = httpGet(t, base+"/ui/nope")
	require.Equal(t, http.StatusNotFound, code)

	// River UI: its application, and its API on River's jobs.
	code, header, _ = httpGet(t, base+"/riverui")
	require.Equal(t, http.StatusFound, code)
	require.Equal(t, "riverui/", header.Get("Location"))
	code, _, body = httpGet(t, base+"/riverui/", "Accept", "text/html")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `{"apiUrl":"/riverui/api","base":"/riverui"}`)
	code, _, body = httpGet(t, base+"/riverui/jobs/"+fmt.Sprint(f.parked[0]), "Accept", "text/html")
	require.Equal(t, http.StatusOK, code, "River UI's own route for a job page")
	require.Contains(t, body, `id="root"`)
	code, _, body = httpGet(t, base+"/riverui/api/jobs?state=pending")
	require.Equal(t, http.StatusOK, code, body)
	var list struct {
		Data []struct {
			ID   int64  `json:"id"`
			Kind string `json:"kind"`
		} `json:"data"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &list))
	var pending []int64
	for _, j := range list.Data {
		require.Equal(t, "demo.sleep", j.Kind)
		pending = append(pending, j.ID)
	}
	require.ElementsMatch(t, f.parked, pending, "River UI lists the parked jobs as pending")

	// A page that cannot be read says why, with a 503; the others still
	// work.
	_, err := f.pool.Exec(context.Background(), `UPDATE settings SET value = '"10s"' WHERE key = $1`, taskcancel.SettingTaskCancellationDurationMillis)
	require.NoError(t, err)
	code, _, body = httpGet(t, base+"/ui/cancellations")
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Contains(t, body, "The page could not be read: setting task_cancellation.duration_millis")
	code, _, _ = httpGet(t, base+"/ui/workers")
	require.Equal(t, http.StatusOK, code)
}

// TestWebPagesEmpty: with nothing to show, each table says so; a program
// without the taskcancel module has no cancellation page.
func TestWebPagesEmpty(t *testing.T) {
	t.Parallel()

	url := testdb.New(t)
	w, _ := startWorker(t, app.Config{Modules: []module.Module{demo.Module()}, DatabaseURL: url})
	base := "http://" + w.HTTPAddr()
	for page, want := range map[string][]string{
		"limits":      {"No limits, and no job holds a slot or is parked.", "No parked jobs."},
		"maintenance": {"No maintenance run yet."},
		"schedules":   {"concurrency_limit.resume"},
		"workers":     {w.ID()},
	} {
		code, _, body := httpGet(t, base+"/ui/"+page)
		require.Equal(t, http.StatusOK, code, page)
		for _, s := range want {
			require.Contains(t, body, s, page)
		}
	}
	code, _, body := httpGet(t, base+"/ui/")
	require.Equal(t, http.StatusOK, code)
	require.NotContains(t, body, "cancellations")
	code, _, _ = httpGet(t, base+"/ui/cancellations")
	require.Equal(t, http.StatusNotFound, code)
}

// TestHTTPToken: off loopback the worker needs a token; with one,
// everything but /healthz and /readyz asks for it (bearer or basic-auth
// password), and the token never reaches the logs.
func TestHTTPToken(t *testing.T) {
	t.Parallel()

	url := testdb.New(t)
	const token = "s3cret-token-for-tests-0123456789"

	for _, tc := range []struct {
		addr, token, prefix, want string
	}{
		{"0.0.0.0:0", "", "", `HTTP address "0.0.0.0:0" is off loopback and no token is set: set SLUICE_HTTP_TOKEN`},
		{":0", "", "", "off loopback"},
		{"[::]:0", "", "", "off loopback"},
		{"example.com:8089", "", "", "off loopback"},
		{"127.0.0.1:0", "short", "", "HTTP token (SLUICE_HTTP_TOKEN) too short: want at least 16 characters, got 5"},
		{"127.0.0.1:0", "has a space in it, sadly", "", "not printable ASCII (or a space) at byte 4"},
		{"", "short", "", "too short"},
		{"127.0.0.1:0", "", "jobs", `invalid HTTP prefix "jobs"`},
		{"127.0.0.1:0", "", "/jobs/", `invalid HTTP prefix "/jobs/"`},
		{"127.0.0.1:0", "", "/a/../b", "no . or .. segments"},
	} {
		cfg := app.Config{Modules: jobtest.Modules(), DatabaseURL: url, HTTPAddr: tc.addr, HTTPToken: tc.token, HTTPPrefix: tc.prefix}
		require.ErrorContains(t, cfg.Validate(), tc.want, "%+v", tc)
		_, err := app.NewWorker(context.Background(), cfg)
		require.ErrorContains(t, err, tc.want, "%+v", tc)
	}
	for _, addr := range []string{"127.0.0.1:0", "localhost:0", "[::1]:0", "127.8.9.10:0"} {
		cfg := app.Config{HTTPAddr: addr}
		require.NoError(t, cfg.Validate(), addr)
	}

	// A worker on every interface, with its token.
	logs := &testlog.Buffer{}
	w, _ := startWorker(t, app.Config{Modules: jobtest.Modules(), DatabaseURL: url, HTTPAddr: "0.0.0.0:0", HTTPToken: token,
		Logger: slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	_, port, err := net.SplitHostPort(w.HTTPAddr())
	require.NoError(t, err)
	base := "http://127.0.0.1:" + port

	for _, path := range []string{"/healthz", "/readyz"} {
		code, _, _ := httpGet(t, base+path)
		require.Equal(t, http.StatusOK, code, "%s stays open for orchestrators", path)
	}
	guarded := []string{"/metrics", "/stats", "/health", "/ui/", "/ui/schedules", "/ui/style.css", "/riverui/", "/riverui/api/jobs", "/", "/nope"}
	for _, path := range guarded {
		for _, header := range [][]string{
			nil,
			{"Authorization", "Bearer wrong-token-0123456789"},
			{"Authorization", "Bearer " + token + "x"},
			{"Authorization", "Bearer"},
			{"Authorization", "Basic " + basic("ops", "wrong")},
			{"Authorization", "Basic " + basic(token, "")},
			{"Authorization", "Basic not-base64"},
			{"Authorization", token},
		} {
			code, h, body := httpGet(t, base+path, header...)
			require.Equal(t, http.StatusUnauthorized, code, "%s %v", path, header)
			require.Equal(t, `Basic realm="sluice", charset="UTF-8"`, h.Get("WWW-Authenticate"))
			require.NotContains(t, body, token)
		}
		for _, header := range [][]string{
			{"Authorization", "Bearer " + token},
			{"Authorization", "bearer " + token},
			{"Authorization", "Basic " + basic("ops", token)},
			{"Authorization", "Basic " + basic("", token)},
		} {
			header = append(header, "Accept", "text/html")
			code, _, body := httpGet(t, base+path, header...)
			switch path {
			case "/":
				require.Equal(t, http.StatusFound, code, "%s %v", path, header)
			case "/nope":
				require.Equal(t, http.StatusNotFound, code, "%s %v", path, header)
			default:
				require.Equal(t, http.StatusOK, code, "%s %v: %s", path, header, body)
			}
		}
	}

	// River UI's API refuses a change from another site (a page elsewhere
	// that the browser would send the credentials from), and makes it from
	// River UI's own page.
	res, err := w.Client().Insert(context.Background(), demo.SleepArgs{MS: 1}, &river.InsertOpts{ScheduledAt: time.Now().Add(time.Hour)})
	require.NoError(t, err)
	id := res.Job.ID
	cancel := func(site string) int {
		req, err := http.NewRequest(http.MethodPost, base+"/riverui/api/jobs/cancel", strings.NewReader(fmt.Sprintf(`{"ids":["%d"]}`, id)))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Sec-Fetch-Site", site)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	require.Equal(t, http.StatusForbidden, cancel("cross-site"))
	require.Equal(t, rivertype.JobStateScheduled, jobState(t, url, id))
	require.Equal(t, http.StatusOK, cancel("same-origin"))
	require.Equal(t, rivertype.JobStateCancelled, jobState(t, url, id))

	require.Contains(t, logs.String(), `"http_token":true`)
	require.NotContains(t, logs.String(), token, "the token was logged")
}

// TestHTTPTokenOnLoopback: a token set on loopback is enforced too.
func TestHTTPTokenOnLoopback(t *testing.T) {
	t.Parallel()

	url := testdb.New(t)
	const token = "loopback-token-0123456789"
	w, _ := startWorker(t, app.Config{Modules: jobtest.Modules(), DatabaseURL: url, HTTPToken: token})
	base := "http://" + w.HTTPAddr()
	code, _, _ := httpGet(t, base+"/metrics")
	require.Equal(t, http.StatusUnauthorized, code)
	code, _, _ = httpGet(t, base+"/metrics", "Authorization", "Bearer "+token)
	require.Equal(t, http.StatusOK, code)
	code, _, _ = httpGet(t, base+"/healthz")
	require.Equal(t, http.StatusOK, code)
}

// TestHTTPPrefix: with HTTPPrefix the worker's own server serves
// everything under it, and River UI builds its URLs from it.
func TestHTTPPrefix(t *testing.T) {
	t.Parallel()

	url := testdb.New(t)
	w, _ := startWorker(t, app.Config{Modules: jobtest.Modules(), DatabaseURL: url, HTTPPrefix: "/ops/sluice"})
	base := "http://" + w.HTTPAddr()

	code, header, _ := httpGet(t, base+"/ops/sluice")
	require.Equal(t, http.StatusFound, code)
	require.Equal(t, "sluice/", header.Get("Location"))
	code, header, _ = httpGet(t, base+"/ops/sluice/")
	require.Equal(t, http.StatusFound, code)
	require.Equal(t, "ui/", header.Get("Location"))
	code, _, body := httpGet(t, base+"/ops/sluice/ui/workers")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, w.ID())
	code, _, body = httpGet(t, base+"/ops/sluice/riverui/", "Accept", "text/html")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `{"apiUrl":"/ops/sluice/riverui/api","base":"/ops/sluice/riverui"}`)
	require.Contains(t, body, `src="/ops/sluice/riverui/assets/`)
	asset := body[strings.Index(body, `src="/ops/sluice/riverui/assets/`)+len(`src="`):]
	asset = asset[:strings.IndexByte(asset, '"')]
	code, _, _ = httpGet(t, base+asset)
	require.Equal(t, http.StatusOK, code, asset)
	code, _, _ = httpGet(t, base+"/ops/sluice/riverui/api/jobs?state=available")
	require.Equal(t, http.StatusOK, code)
	code, _, _ = httpGet(t, base+"/ui/workers")
	require.Equal(t, http.StatusNotFound, code, "nothing outside the prefix")
}

// basic is the credentials of a basic Authorization header.
func basic(user, password string) string {
	req, _ := http.NewRequest(http.MethodGet, "/", nil)
	req.SetBasicAuth(user, password)
	return strings.TrimPrefix(req.Header.Get("Authorization"), "Basic ")
}

// TestPprof: with Pprof the worker serves Go's profiles at /debug/pprof/,
// behind the token; without it, not at all.
func TestPprof(t *testing.T) {
	t.Parallel()

	url := testdb.New(t)
	const token = "pprof-token-0123456789"
	on, _ := startWorker(t, app.Config{Modules: jobtest.Modules(), DatabaseURL: url, HTTPToken: token, Pprof: true, ID: "pprof-on"})
	off, _ := startWorker(t, app.Config{Modules: jobtest.Modules(), DatabaseURL: url, ID: "pprof-off"})

	base := "http://" + on.HTTPAddr()
	code, _, _ := httpGet(t, base+"/debug/pprof/heap")
	require.Equal(t, http.StatusUnauthorized, code, "a profile without the token")
	code, header, body := httpGet(t, base+"/debug/pprof/heap", "Authorization", "Bearer "+token)
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "application/octet-stream", header.Get("Content-Type"))
	require.NotEmpty(t, body, "the heap profile")
	code, _, body = httpGet(t, base+"/debug/pprof/", "Authorization", "Bearer "+token)
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "goroutine")

	code, _, _ = httpGet(t, "http://"+off.HTTPAddr()+"/debug/pprof/heap")
	require.Equal(t, http.StatusNotFound, code, "profiles served without --pprof")
}
