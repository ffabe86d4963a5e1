import { useQuery } from "@tanstack/react-query";
import { Link } from "react-router-dom";
import { api, must } from "../api/client";
import { Pager, useCursor } from "../components/pager";
import { QueryState } from "../components/states";
import { StatusBadge } from "../components/status";
import { RelTime } from "../components/time";
import { isTerminal } from "./deploy/common";
import "./deploy/deploy.css";

export default function Deployments() {
  const cursor = useCursor();
  const deployments = useQuery({
    queryKey: ["deployments", cursor.after],
    queryFn: () => must(api.GET("/api/deployments", { params: { query: { limit: 20, after: cursor.after } } })),
    // Follow the ones still moving (pending, starting, ready, stopping).
    refetchInterval: (query) => (query.state.data?.data.some((d) => !isTerminal(d)) ? 3000 : false),
  });
  return (
    <>
      <div className="toolbar deploy-head">
        <h1>Deployments</h1>
        <span className="spacer" />
        <Link to="/deployments/new" className="button primary">
          New deployment
        </Link>
      </div>
      <QueryState
        query={deployments}
        what="Loading deployments"
        isEmpty={(page) => page.data.length === 0 && cursor.page === 1}
        empty={
          <p>
            No deployments yet. Serve a trained drafter: open a finished job and press <strong>Deploy</strong> on a
            checkpoint, or <Link to="/deployments/new">create a deployment</Link> from a Hub drafter.
          </p>
        }
      >
        {(page) => (
          <>
            <div className="table-wrap">
              <table aria-label="Deployments">
                <thead>
                  <tr>
                    <th>Served name</th>
                    <th>Status</th>
                    <th className="num">Replicas</th>
                    <th className="hide-narrow">Drafter</th>
                    <th className="hide-narrow">Verifier</th>
                    <th className="num hide-narrow">Restarts</th>
                    <th className="hide-narrow">Runtime</th>
                    <th>Age</th>
                  </tr>
                </thead>
                <tbody>
                  {page.data.map((d) => (
                    <tr key={d.id}>
                      <td>
                        <Link to={`/deployments/${d.id}`}>
                          <strong className="mono">{d.name}</strong>
                        </Link>
                        <div className="mono dim">{d.id}</div>
                      </td>
                      <td>
                        <StatusBadge status={d.status} />
                      </td>
                      <td className="num nowrap" title="ready of wanted">
                        {d.replica_states.filter((r) => r.status === "ready").length}/{d.replicas}
                      </td>
                      <td className="hide-narrow wrap-anywhere">
                        <span className="mono">{d.drafter}</span>
                        <div className="dim">{d.kind}</div>
                      </td>
                      <td className="hide-narrow mono wrap-anywhere">{d.verifier}</td>
                      <td className="num hide-narrow">{d.restarts}</td>
                      <td className="hide-narrow">{d.runtime}</td>
                      <td className="nowrap">
                        <RelTime at={d.created_at} />
                      </td>
                    </tr>
                  ))}
                </tbody>
              </table>
            </div>
            {page.data.length === 0 && <p className="state empty">No more deployments.</p>}
            <Pager cursor={cursor} hasMore={page.has_more} lastId={page.last_id} />
          </>
        )}
      </QueryState>
    </>
  );
}
