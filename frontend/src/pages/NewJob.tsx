// Placeholder until this page is written.
export default function NewJob() {
  return <h1>NewJob</h1>;
}
