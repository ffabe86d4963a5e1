// Placeholder until this page is written.
export default function Workers() {
  return <h1>Workers</h1>;
}
