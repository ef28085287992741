package web

import (
	"bytes"
	"context"
	"embed"
	"fmt"
	"html/template"
	"log/slog"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-dev/sluice/db"
	"github.com/sluice-dev/sluice/module"
)

// PagesPath is where the pages are served, under the handler's root.
const PagesPath = "/ui"

// pageTimeout bounds the database reads of one page.
const pageTimeout = 10 * time.Second

//go:embed templates/*.html
var templatesFS embed.FS

//go:embed static/style.css
var styleCSS []byte

// PagesConfig configures the pages.
type PagesConfig struct {
	// DB reads the pages' data: sluice's pool (sluice's schema, then
	// River's, on its search_path).
	DB db.DBTX
	// ModulePages are the modules' pages, after sluice's own.
	ModulePages []module.Page
	// RiverUI is the path of River UI relative to the pages' root, such as
	// "../riverui/": jobs link to their page there. Empty: jobs are not
	// linked and River UI is not listed.
	RiverUI string
	// Links are more entries of the index (the JSON endpoints, say), their
	// Href relative to the pages' root.
	Links []Link
	// Logger receives the errors of pages that could not be read.
	Logger *slog.Logger
}

// Link is an entry of the index.
type Link struct {
	// Title is the link's text.
	Title string
	// Href is where it leads, relative to the pages' root.
	Href string
	// Summary is a line about it.
	Summary string
}

// Pages serves sluice's pages: the index at its root, and each page at its
// name ("schedules", "limits", "workers", "maintenance", then the
// modules'). Every link it makes is relative, so it works wherever it is
// mounted (with http.StripPrefix).
type Pages struct {
	cfg   PagesConfig
	pages []module.Page
	index *template.Template
	page  *template.Template
	mux   *http.ServeMux
}

// pageNameRE is what a page's name may be.
var pageNameRE = regexp.MustCompile(`^[a-z][a-z0-9-]{0,39}$`)

// CorePages are sluice's own pages, in the order of the index.
func CorePages() []module.Page {
	return []module.Page{schedulesPage(), limitsPage(), workersPage(), maintenancePage()}
}

// NewPages builds the pages. A module page whose name is malformed or
// taken is an error.
func NewPages(cfg PagesConfig) (*Pages, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	p := &Pages{cfg: cfg, pages: CorePages(), mux: http.NewServeMux()}
	seen := map[string]bool{"style.css": true}
	for _, page := range p.pages {
		seen[page.Name] = true
	}
	for _, page := range cfg.ModulePages {
		switch {
		case !pageNameRE.MatchString(page.Name):
			return nil, fmt.Errorf("invalid page name %q: want lowercase letters, digits and '-'", page.Name)
		case seen[page.Name]:
			return nil, fmt.Errorf("page %q is defined twice", page.Name)
		case page.Read == nil || page.Title == "":
			return nil, fmt.Errorf("page %q needs a Title and a Read", page.Name)
		}
		seen[page.Name] = true
		p.pages = append(p.pages, page)
	}
	var err error
	if p.index, err = template.ParseFS(templatesFS, "templates/layout.html", "templates/index.html"); err != nil {
		return nil, fmt.Errorf("parse the index template: %w", err)
	}
	if p.page, err = template.ParseFS(templatesFS, "templates/layout.html", "templates/page.html"); err != nil {
		return nil, fmt.Errorf("parse the page template: %w", err)
	}
	p.mux.HandleFunc("GET /{$}", p.serveIndex)
	p.mux.HandleFunc("GET /style.css", serveStyle)
	for _, page := range p.pages {
		p.mux.HandleFunc("GET /"+page.Name, p.servePage(page))
	}
	return p, nil
}

// ServeHTTP serves the index, the pages and their style sheet.
func (p *Pages) ServeHTTP(w http.ResponseWriter, r *http.Request) { p.mux.ServeHTTP(w, r) }

// layoutData is what the layout shows around a page's body.
type layoutData struct {
	Title   string
	Nav     []navLink
	RiverUI string
	ReadAt  string
	// The index's entries.
	Index []Link
	// A page's content.
	Error  string
	Notes  []string
	Tables []tableView
}

type navLink struct {
	Title, Href string
	Current     bool
}

type tableView struct {
	Caption   string
	Columns   []string
	Rows      [][]cellView
	Empty     string
	Truncated bool
}

type cellView struct {
	Text, Href, Class, Title, Datetime, Rel string
}

// layout is the frame of a page; now, when set, is the database's clock
// when the page was read.
func (p *Pages) layout(title, current string, now time.Time) layoutData {
	d := layoutData{Title: title, RiverUI: p.cfg.RiverUI}
	if !now.IsZero() {
		d.ReadAt = now.UTC().Format(timestampFormat)
	}
	for _, page := range p.pages {
		d.Nav = append(d.Nav, navLink{Title: page.Title, Href: page.Name, Current: page.Name == current})
	}
	return d
}

func (p *Pages) serveIndex(w http.ResponseWriter, r *http.Request) {
	d := p.layout("Operations", "", time.Time{})
	for _, page := range p.pages {
		d.Index = append(d.Index, Link{Title: page.Title, Href: page.Name, Summary: page.Summary})
	}
	if p.cfg.RiverUI != "" {
		d.Index = append(d.Index, Link{Title: "River UI", Href: p.cfg.RiverUI, Summary: "River's jobs and queues: list, inspect, cancel, retry, delete; pause and resume queues"})
	}
	d.Index = append(d.Index, p.cfg.Links...)
	p.render(w, p.index, http.StatusOK, d)
}

func (p *Pages) servePage(page module.Page) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), pageTimeout)
		defer cancel()
		content, err := page.Read(ctx, p.cfg.DB)
		if err != nil {
			p.cfg.Logger.Warn("web page could not be read", "page", page.Name, "error", err)
			d := p.layout(page.Title, page.Name, time.Time{})
			d.Error = "The page could not be read: " + err.Error()
			p.render(w, p.page, http.StatusServiceUnavailable, d)
			return
		}
		d := p.layout(page.Title, page.Name, content.Now)
		now := content.Now
		if now.IsZero() {
			now = time.Now()
		}
		d.Notes = content.Notes
		for _, t := range content.Tables {
			d.Tables = append(d.Tables, p.tableView(t, now))
		}
		p.render(w, p.page, http.StatusOK, d)
	}
}

func (p *Pages) tableView(t module.PageTable, now time.Time) tableView {
	v := tableView{Caption: t.Caption, Columns: t.Columns, Empty: t.Empty, Truncated: t.Truncated}
	for _, row := range t.Rows {
		cells := make([]cellView, len(row))
		for i, c := range row {
			cells[i] = p.cellView(c, now)
		}
		v.Rows = append(v.Rows, cells)
	}
	return v
}

func (p *Pages) cellView(c module.PageCell, now time.Time) cellView {
	v := cellView{Text: c.Text, Class: c.Status, Title: c.Title}
	if c.Long {
		v.Class = strings.TrimSpace(v.Class + " long")
	}
	switch {
	case c.JobID > 0:
		if v.Text == "" {
			v.Text = "#" + strconv.FormatInt(c.JobID, 10)
		}
		if p.cfg.RiverUI != "" {
			v.Href = p.cfg.RiverUI + "jobs/" + strconv.FormatInt(c.JobID, 10)
		}
	case c.Time != nil:
		v.Text = shortTime(*c.Time, now)
		v.Datetime = c.Time.UTC().Format(time.RFC3339Nano)
		v.Rel = relative(*c.Time, now)
	}
	return v
}

// render executes t into a buffer first, so that a template error is a
// clean 500 rather than half a page.
func (p *Pages) render(w http.ResponseWriter, t *template.Template, status int, d layoutData) {
	var buf bytes.Buffer
	if err := t.ExecuteTemplate(&buf, "layout", d); err != nil {
		p.cfg.Logger.Error("web page could not be rendered", "page", d.Title, "error", err)
		http.Error(w, "500 internal error: the page could not be rendered", http.StatusInternalServerError)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	// No script, no frame, no form: the pages only read.
	h.Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

func serveStyle(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/css; charset=utf-8")
	w.Header().Set("Cache-Control", "max-age=300")
	_, _ = w.Write(styleCSS)
}
