// How to call the deployment: its endpoint, and curl and Python snippets to copy.
import { Link } from "react-router-dom";
import type { Deployment } from "../../api/client";
import { CopyBlock } from "../../components/copy";
import { curlSnippet, pythonSnippet } from "../deploy/common";

export function Snippets({ deployment }: { deployment: Deployment }) {
  return (
    <section className="card" aria-label="Use it">
      <h2>Use it</h2>
      <p className="hint">
        An OpenAI-compatible endpoint at <code>{window.location.origin}/v1</code>, model{" "}
        <code>{deployment.name}</code>. Set <code>SPECDECK_API_KEY</code> to one of your API keys (
        <Link to="/settings">Settings</Link>).
        {deployment.status !== "ready" && " It answers once the deployment is ready."}
      </p>
      <CopyBlock label="curl" text={curlSnippet(deployment.name)} />
      <CopyBlock label="Python (openai)" text={pythonSnippet(deployment.name)} />
    </section>
  );
}
