// A dataset's rows as a reader sees them (GET /api/datasets/{id}/rows), a page at a time.
import { useState } from "react";
import { keepPreviousData, useQuery } from "@tanstack/react-query";
import { api, must, type Dataset } from "../../api/client";
import { QueryState } from "../../components/states";

const PAGE = 5;

export function DatasetPreview({ dataset }: { dataset: Dataset }) {
  const [offset, setOffset] = useState(0);
  const rows = useQuery({
    queryKey: ["dataset-rows", dataset.id, offset],
    queryFn: () =>
      must(
        api.GET("/api/datasets/{dataset_id}/rows", {
          params: { path: { dataset_id: dataset.id }, query: { offset, limit: PAGE } },
        }),
      ),
    placeholderData: keepPreviousData,
  });
  const total = dataset.num_conversations;
  return (
    <section className="dataset-preview" aria-label={`Rows of ${dataset.name}`}>
      <QueryState query={rows} what="Loading rows" isEmpty={(p) => p.data.length === 0} empty={<p>No rows.</p>}>
        {(page) => (
          <>
            <ol className="preview-rows" start={page.offset + 1}>
              {page.data.map((row) => (
                <li key={row.index} aria-label={`Row ${row.index + 1}`}>
                  {row.turns.map((turn, i) => (
                    <div key={i} className={`turn turn-${turn.role}`}>
                      <span className="role">{turn.role}</span>
                      <span className="text">
                        {turn.text}
                        {turn.cut && <span className="dim"> … (cut)</span>}
                      </span>
                    </div>
                  ))}
                </li>
              ))}
            </ol>
            <div className="preview-pager">
              <span className="dim">
                Rows {page.offset + 1}–{page.offset + page.data.length}
                {total != null && ` of ${total}`}
              </span>
              <button type="button" disabled={offset === 0} onClick={() => setOffset(Math.max(0, offset - PAGE))}>
                Previous
              </button>
              <button type="button" disabled={!page.has_more} onClick={() => setOffset(offset + PAGE)}>
                Next
              </button>
            </div>
          </>
        )}
      </QueryState>
    </section>
  );
}
