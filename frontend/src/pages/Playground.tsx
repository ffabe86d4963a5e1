// Placeholder until this page is written.
export default function Playground() {
  return <h1>Playground</h1>;
}
