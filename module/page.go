package module

import (
	"context"
	"time"

	"github.com/sluice-dev/sluice/db"
)

// Page is one of a module's pages among the worker's web pages (package
// web): a title, lines of text and tables, read from the database on every
// request and rendered on the server like sluice's own pages.
type Page struct {
	// Name is the page's path under the pages' root, such as
	// "cancellations": lowercase letters, digits and '-'.
	Name string
	// Title heads the page and names its link on the index.
	Title string
	// Summary is one line about the page, under its link on the index.
	Summary string
	// Read reads the page's content through dbtx.
	Read func(ctx context.Context, dbtx db.DBTX) (*PageContent, error)
}

// PageContent is what a page shows: paragraphs, then tables.
type PageContent struct {
	// Now is the database's clock when the content was read: times are
	// shown relative to it (zero: the process's clock).
	Now time.Time
	// Notes are paragraphs above the tables.
	Notes []string
	// Tables are the page's tables, in order.
	Tables []PageTable
}

// PageTable is one table of a page.
type PageTable struct {
	// Caption heads the table.
	Caption string
	// Columns are the column headings.
	Columns []string
	// Rows are the rows, each with one cell per column.
	Rows [][]PageCell
	// Empty is shown instead of the table when it has no rows.
	Empty string
	// Truncated says that the table shows only its first rows: more
	// exist.
	Truncated bool
}

// PageCell is one cell of a table. Text is shown as it is (escaped); Time,
// when set, is shown instead, with how long ago (or in how long) it is.
type PageCell struct {
	// Text is the cell's text.
	Text string
	// Time, when set, is shown as a timestamp relative to PageContent.Now.
	Time *time.Time
	// JobID, when positive, links the cell to the River UI page of that
	// River job (Text defaults to the id).
	JobID int64
	// Status, when set, colours the cell: "ok", "warn" or "bad".
	Status string
	// Title is shown on hover (the whole of a shortened text, say).
	Title string
	// Long marks free text (an error, details) that may wrap.
	Long bool
}
