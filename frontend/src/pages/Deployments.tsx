// Placeholder until this page is written.
export default function Deployments() {
  return <h1>Deployments</h1>;
}
