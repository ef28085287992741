package web_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/module"
	"github.com/sluice-dev/sluice/web"
)

// modulePage is a module's page with fixed content.
func modulePage(name string, content *module.PageContent, err error) module.Page {
	return module.Page{Name: name, Title: "Title of " + name, Summary: "about " + name,
		Read: func(context.Context, db.DBTX) (*module.PageContent, error) { return content, err }}
}

func serve(t *testing.T, h http.Handler, path string) (int, string) {
	t.Helper()
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, path, nil))
	body, err := io.ReadAll(w.Result().Body)
	require.NoError(t, err)
	return w.Code, string(body)
}

// TestModulePage: a module's page is listed on the index and rendered
// from its content: escaped text, times relative to the database's clock,
// job links to River UI, status colours, the note of a truncated table.
func TestModulePage(t *testing.T) {
	t.Parallel()

	now := time.Date(2026, 3, 8, 12, 0, 0, 0, time.UTC)
	earlier, tomorrow := now.Add(-90*time.Second), now.Add(25*time.Hour)
	content := &module.PageContent{
		Now:   now,
		Notes: []string{"a <b>note</b>"},
		Tables: []module.PageTable{
			{Caption: "Things", Columns: []string{"Job", "When", "Next", "State"}, Truncated: true, Rows: [][]module.PageCell{{
				{JobID: 42},
				{Time: &earlier},
				{Time: &tomorrow},
				{Text: "<script>alert(1)</script>", Status: "bad", Title: `say "hi"`},
			}}},
			{Caption: "Nothing", Columns: []string{"X"}, Empty: "Nothing here."},
		},
	}
	pages, err := web.NewPages(web.PagesConfig{RiverUI: "../riverui/", ModulePages: []module.Page{
		modulePage("things", content, nil),
		modulePage("broken", nil, errors.New("setting x: want a number")),
	}})
	require.NoError(t, err)

	code, body := serve(t, pages, "/")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `<a href="things">Title of things</a> <span>about things</span>`)
	require.Contains(t, body, `<a href="schedules">Schedules</a>`, "sluice's own pages come first")
	require.Less(t, strings.Index(body, `href="maintenance"`), strings.Index(body, `href="things"`))

	code, body = serve(t, pages, "/things")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `<p class="note">a &lt;b&gt;note&lt;/b&gt;</p>`)
	require.Contains(t, body, `<td><a href="../riverui/jobs/42">#42</a></td>`)
	require.Contains(t, body, `<time datetime="2026-03-08T11:58:30Z">11:58:30Z</time> <small>1m30s ago</small>`)
	require.Contains(t, body, `<time datetime="2026-03-09T13:00:00Z">2026-03-09 13:00:00Z</time> <small>in 25h00m</small>`)
	require.Contains(t, body, `<td class="bad" title="say &#34;hi&#34;">&lt;script&gt;alert(1)&lt;/script&gt;</td>`)
	require.NotContains(t, body, "<script>")
	require.Contains(t, body, "Only the first 1 rows are shown.")
	require.Contains(t, body, `<p class="empty">Nothing here.</p>`)
	require.Contains(t, body, "Read 2026-03-08 12:00:00Z (the database's clock)")
	require.Contains(t, body, `<a href="things" aria-current="page">`)

	code, body = serve(t, pages, "/broken")
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Contains(t, body, "The page could not be read: setting x: want a number")

	code, _ = serve(t, pages, "/nope")
	require.Equal(t, http.StatusNotFound, code)

	// Without River UI, jobs are not linked.
	plain, err := web.NewPages(web.PagesConfig{ModulePages: []module.Page{modulePage("things", content, nil)}})
	require.NoError(t, err)
	_, body = serve(t, plain, "/things")
	require.Contains(t, body, `<td>#42</td>`)
	_, body = serve(t, plain, "/")
	require.NotContains(t, body, "River UI")
}

func TestModulePageNames(t *testing.T) {
	t.Parallel()
	empty := &module.PageContent{}
	for _, tc := range []struct {
		pages []module.Page
		want  string
	}{
		{[]module.Page{modulePage("Things", empty, nil)}, `invalid page name "Things"`},
		{[]module.Page{modulePage("a/b", empty, nil)}, `invalid page name "a/b"`},
		{[]module.Page{modulePage("", empty, nil)}, `invalid page name ""`},
		{[]module.Page{modulePage("schedules", empty, nil)}, `page "schedules" is defined twice`},
		{[]module.Page{modulePage("style.css", empty, nil)}, `invalid page name "style.css"`},
		{[]module.Page{modulePage("x", empty, nil), modulePage("x", empty, nil)}, `page "x" is defined twice`},
		{[]module.Page{{Name: "x", Title: "X"}}, `page "x" needs a Title and a Read`},
	} {
		_, err := web.NewPages(web.PagesConfig{ModulePages: tc.pages})
		require.ErrorContains(t, err, tc.want)
	}
}

func TestAge(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]string{
		0:                                 "0s",
		250 * time.Millisecond:            "250ms",
		42 * time.Second:                  "42s",
		-42 * time.Second:                 "42s",
		5*time.Minute + 3*time.Second:     "5m03s",
		3*time.Hour + 5*time.Minute:       "3h05m",
		47 * time.Hour:                    "47h00m",
		4*24*time.Hour + 2*time.Hour + 59: "4d02h",
	} {
		require.Equal(t, want, web.Age(d), d.String())
	}
}
