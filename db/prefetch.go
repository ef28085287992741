package db

// PrefetchLineFront asks q's Pipeline, when q runs on one, to send
// LineFront with arg right after its next statement that returns rows
// (Pipeline.Prefetch): a LineFront with the same arg that follows reads
// them without a round trip of its own. Elsewhere it does nothing.
func (q *Queries) PrefetchLineFront(arg LineFrontParams) {
	if p, ok := q.db.(*Pipeline); ok {
		p.Prefetch("LineFront", lineFront, arg.Keys, arg.Kind, arg.KeyMax, arg.PerKey)
	}
}

// PrefetchKeyLines is PrefetchLineFront for KeyLines.
func (q *Queries) PrefetchKeyLines(arg KeyLinesParams) {
	if p, ok := q.db.(*Pipeline); ok {
		p.Prefetch("KeyLines", keyLines, arg.Kind, arg.Keys, arg.PeriodMs)
	}
}
